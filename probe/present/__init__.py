"""Presentation: what a person reads. Figures, page sections, terminal text and the descriptions of each analysis's
output files (one module per analysis), the page skeleton every page shares, files written atomically, console notes
and one-line user errors. Above ``probe.analyses`` (which computes and never prints or writes)."""

"""Jobs: what a run is asked to do (typed specs), its inputs (model loading; windows from the one window builder,
``probe.data.windows``), the resumable store of many-model runs (``store``), the batch report and the merge of report
shards. Above ``probe.present``."""

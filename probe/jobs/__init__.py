"""Jobs: what a run is asked to do (typed specs), its inputs (the one window builder, model loading), the resumable
store of many-model runs, the batch report and the merge of report shards. Above ``probe.present``."""

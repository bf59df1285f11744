"""The engine: what a run does, as plain functions, with no Prefect and no Ray.

Read in the order a run goes:

- :mod:`.spec` - the study spec composed where the layers meet (each section the model of the
  module that owns it) and loaded once per command (:func:`~.spec.load_spec`);
- :mod:`.run_folder` - the run folder's layout (ledger, store, releases, lock, recorded spec)
  and a :class:`~.run_folder.Workspace` opened for one spec;
- :mod:`.sources` - load the photos, check each can serve the design (one face, a limb mask),
  record them in the ledger, and plan the grid (templates x conditions, once per editor);
- :mod:`.template` - a template's attempts: the noise floor, then each round of the cell
  lifecycle (:func:`~counterfactory.manifests.lifecycle.fill_cells`) planned, edited and judged;
- :mod:`.execute` - the work an executor runs: a batch of attempts edited and committed, a batch
  judged, and what decides a verdict (:func:`~.execute.judge_key`);
- :mod:`.executors` - where that work runs: the :class:`~.executors.Executor` interface, and
  this process (:class:`~.executors.LocalExecutor`; Ray's is in :mod:`counterfactory.flows.ray`);
- :mod:`.outcomes` - what the cells came to, read from the ledger (the publishing policy) and
  checked for completeness;
- :mod:`.release` - a release built and sealed from the outcomes;
- :mod:`.stats` - the release's statistics and audits (noise floors, expressions, gate audit);
- :mod:`.verify` - a release verified whole (the bottom layer's checks with the derived files');
- :mod:`.plugins` - every registry of plug-ins, listed.

Orchestration (:mod:`counterfactory.flows.run`, ``resume``, ``ray``, ``schedule``, ...) and the
interfaces (``cli``, ``review_app``) sit beside this package in ``flows/`` and call into it.
Per-item problems end as values in the ledger; only problems that make the whole run
impossible raise.
"""

"""The root of every exception counterfactory raises, and the one for "this run cannot start here".

Every exception class of the package derives from :class:`CounterfactoryError`, so a caller
(the command line, a notebook, a scheduler) can catch the package's errors in one ``except``
and let anything else (a bug) show its traceback. The command line prints
``error: <message>`` and exits with status 2 for any of them (one handler, in
:mod:`counterfactory.flows.cli`). A class that was a ``ValueError``, ``RuntimeError`` or
``OSError`` before the root existed keeps that builtin as a second base, so code that catches
the builtin still catches it. Every message names the file or field at fault and says what
to do.

The tree: each class with the builtin base it keeps (if any) and the module that defines it,
then who raises it and what the user does. ``tests/manifests/test_errors.py`` checks it against
every exception class of the package (name, module, base), so it cannot drift::

    CounterfactoryError                   manifests.errors: the root.
    ├── SpecError (ValueError)            manifests.spec: the engine's load_spec: the spec is not valid,
    │                                     or a file it names (sources, prompt templates,
    │                                     trials.prompts, trials.biographies, an editor's table)
    │                                     is missing. Fix the field the message names.
    ├── YamlLimitError (ValueError)       manifests.yamlsafe: a YAML file over a size or alias
    │                                     limit, or a number literal (YAML or JSON) of more than
    │                                     40 characters. Check it is the right file.
    ├── YamlDuplicateKeyError (ValueError)  manifests.yamlsafe: a YAML mapping names one key twice
    │                                     (the message names it and both lines). Remove one.
    ├── InputFileError (ValueError)       manifests.safefiles: a file an imported set or metadata
    │                                     names is outside its folder (no allowed root holds it),
    │                                     has a NUL byte in its name, is not a regular file or is
    │                                     too large; the import names the row. Fix the row, copy
    │                                     the file in, or set editor.import.allowed_roots.
    ├── MetadataError (ValueError)        generation.errors: the sources' metadata file as a
    │                                     whole. Fix the entries and fields it lists.
    ├── SourceError                       generation.errors: one photo cannot be used (the run
    │                                     records the source as failed). Replace the photo.
    ├── MaskError (ValueError)            generation.masks: a limb mask cannot be built (wrong
    │                                     size, missing file, bad polygon). Redraw or re-store it.
    ├── TableError (ValueError)           generation.editors.tables: a pair table cannot be
    │                                     read. Fix its format or columns.
    ├── TrialError (ValueError)           manifests.trials: a trial bank cannot be built (prompt
    │                                     bank or biographies). Fix trials.* in the spec.
    ├── LicenceError (ValueError)         manifests.licences: a source's licence is unknown or
    │                                     the licences conflict. Fix the metadata's licence.
    ├── SetupError (RuntimeError)         manifests.errors: a model file, optional dependency,
    │   │                                 GPU or API key is missing, or a calibration file.
    │   │                                 Install or set what the message names; nothing was
    │   │                                 paid for.
    │   ├── PluginError                   manifests.registry: an installed package's
    │   │                                 counterfactory.plugins entry point failed to import.
    │   │                                 Fix or uninstall the distribution it names.
    │   └── RayTargetError                flows.ray: the Ray cluster does not answer, or cannot
    │                                     share the run's ledger. Check the address and ledger_url.
    ├── ScheduleError (ValueError)        flows.schedule: a cron, interval or timezone that
    │                                     cannot be served. Write a valid one.
    ├── PrefectServerError (RuntimeError)  flows.server: the in-process Prefect server did not
    │                                     start. Check PREFECT_HOME, or name a server (PREFECT_API_URL).
    ├── RunFolderError (RuntimeError)     manifests.runlock: the output folder is unwritable, not
    │                                     a folder, or another run holds it. Wait or choose another.
    ├── LedgerError (RuntimeError)        manifests.ledger: the ledger cannot be opened safely.
    │                                     Follow the recovery the message gives.
    ├── MissingBlobError (FileNotFoundError)  manifests.store: an image the ledger names is not in
    │                                     the store. Re-run the spec: only those attempts re-run.
    ├── DamagedBlobError (OSError)        manifests.store: a stored image's bytes no longer match
    │                                     its hash. Delete it and re-run.
    ├── UnsafeBlobError (OSError)         manifests.store: a store entry that is a symlink, a FIFO
    │                                     or another non-regular file; never read. Delete it and re-run.
    ├── PublishError (RuntimeError)       flows.engine.outcomes: a release that must not be sealed.
    │   ├── EmptyReleaseError             flows.engine.release: no cell was accepted or is waiting for
    │   │                                 review.
    │   └── IncompleteGridError           flows.engine.release: cells, sources or strata are missing;
    │                                     pass --allow-incomplete to seal what there is.
    ├── ReleaseExistsError (RuntimeError)  manifests.release: the version exists with other
    │                                     content. Raise release.version.
    ├── NotAReleaseError (FileNotFoundError)  manifests.release_folder: a folder given as a release
    │                                     is not one (no release.json). Pass DIR/releases/NAME/VERSION.
    ├── ReleaseFileError (ValueError)     manifests.release_folder: a release file a reader refuses
    │                                     (not regular, too large, not JSON of its shape), a row naming
    │                                     an image outside the release, not regular or hard-linked, or
    │                                     an output inside a sealed release. Run verify; restore it.
    ├── ReleaseIntegrityError (RuntimeError)  manifests.release: a file for a release does not
    │                                     have its sha256. Re-run; the store may be damaged.
    ├── ReleaseSourceMissingError (FileNotFoundError)  manifests.release: a file a release is
    │                                     built from (a source photo, a store image) is gone
    │                                     since the run. Restore it, or re-run the spec.
    ├── DiffError (ValueError)            validation.release_diff: two folders that cannot be
    │                                     compared. Pass two releases of one study.
    ├── ReviewError (ValueError)          manifests.review: a review decision that cannot be
    │                                     recorded (``status`` is its HTTP status).
    ├── HubError (RuntimeError)           manifests.hub: a push or pull that must not go ahead.
    │   └── HubTransferError              manifests.hub: the Hub dropped a request part-way
    │                                     (exit status 1): run the same command again; it resumes.
    ├── PairError                         flows.audit: a measured pair's file cannot be read
    │                                     (its batch row is ``failed``; ``measure`` stops). Fix
    │                                     the path.
    ├── RunSpecNotFoundError (FileNotFoundError)  flows.engine.run_folder: the run folder records no
    │                                     spec and has no release to take one from. Pass --spec.
    ├── PhotoSetError (FileNotFoundError)  validation.calibration.photo_sets: a photo set's folder lacks
    │                                     london_info.csv or the photos it lists. Point
    │                                     --london at the London Set's folder.
    ├── ReviewCalibrationError (ValueError)  validation.calibration.from_review: a run that cannot
    │                                     be calibrated from its review (no reviewed items, too few
    │                                     labels or sources). Review more of its queue.
    ├── AnswersError (ValueError)         validation.scoring.answers: answers that cannot be read
    │                                     or are not the release's (another bank, unknown trial
    │                                     ids; also raised by score). Score each release with its
    │                                     own answers.
    ├── AskError (ValueError)             validation.scoring.ask: ``ask`` cannot start (an
    │                                     unknown protocol or backend, nothing to judge; also
    │                                     raised by judge). Fix the option the message names.
    ├── HarnessExportError (ValueError)   manifests.harness: a release that cannot be exported
    │                                     for lmms-eval or VLMEvalKit (not a release folder, a
    │                                     trial without its image paths, an unknown harness).
    ├── TransportError                    validation.scoring.backends: an endpoint answered with
    │                                     something that is not a chat completion; ``ask``'s paid
    │                                     client retries it (as it does the openai client's
    │                                     connection, time-out, 429 and 5xx errors), and a re-run
    │                                     asks what still failed.
    ├── ReplyError (ValueError)           validation.scoring.backends: a reply ``ask`` cannot record
    │                                     as an answer (a shape it does not know, token counts
    │                                     that are not counts, a body over max_reply_bytes):
    │                                     recorded as an error row for that answer, paid once,
    │                                     never asked again, not scored.
    │   internal signals, caught where they are raised and never shown to a user:
    ├── PaidCallFailed                    manifests.paid.base: one paid call ends with a non-ok
    │                                     answer (the paid client turns it into that answer).
    ├── _Lost                             manifests.paid.fal: fal lost a request; submit again.
    ├── _UnsupportedPixels (ValueError)   generation.images: a pixel format with no 8-bit mapping.
    └── _WorkToDo                         flows.resume: a re-run is not settled in the ledger, so
                                          the flow runs.
"""

from __future__ import annotations


class CounterfactoryError(Exception):
    """The base of every exception counterfactory raises; the message says what is wrong and
    what to do. The command line prints it as ``error: <message>`` and exits with status 2."""


class SetupError(CounterfactoryError, RuntimeError):
    """A run cannot start on this machine or with this spec; the message names the fix.

    Every setup failure (a missing model file or optional dependency, no GPU, a bad or missing
    API key, an unknown backend or gate name, a missing prompt template or calibration) raises
    it before any work is done or paid for.
    """

"""Calibration: where the gates' shipped thresholds come from (``counterfactory calibrate``).

- :mod:`.calibrate`: the run, no-op ceilings and the different-person floor on real photos;
- :mod:`.skin`: the skin-tone gate's no-op ceiling and face-to-body gap;
- :mod:`.failures`: a seeded corpus of good edits and editor failures made from the photos;
- :mod:`.photo_sets`: the photo sets the corpus is made from and how each is split;
- :mod:`.corpus_fit`: the thresholds fitted on the corpus, and held-out figures per path and group;
- :mod:`.base`: what they share (the bundled photos, reading them, a progress bar, rounding).

The shipped result is read at run time by :mod:`counterfactory.validation.thresholds`.
"""

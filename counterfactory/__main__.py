"""``python -m counterfactory`` is the ``counterfactory`` command."""

from counterfactory.flows.cli import main

if __name__ == "__main__":
    main()

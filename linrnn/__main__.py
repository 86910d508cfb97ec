"""``python -m linrnn``: the ``linrnn`` command."""

from linrnn.cli import main

if __name__ == "__main__":
    raise SystemExit(main())

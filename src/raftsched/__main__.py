"""`python -m raftsched ...` is the `raftsched` command."""

from raftsched.cli import main

if __name__ == "__main__":
    raise SystemExit(main())

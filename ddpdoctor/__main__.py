"""``python -m ddpdoctor`` (and ``torchrun -m ddpdoctor check``)."""

from ddpdoctor.cli import main

if __name__ == "__main__":
    main()

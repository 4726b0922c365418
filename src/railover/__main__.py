"""``python -m railover``: the ``railover`` command line without the console script, for an
environment whose scripts directory is not on ``PATH`` (``pip install --user``, a venv not
activated). Runs the same guarded entry point (:mod:`railover._entry`)."""
from railover._entry import main

if __name__ == "__main__":
    main()

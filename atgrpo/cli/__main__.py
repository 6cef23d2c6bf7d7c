"""`python -m atgrpo.cli ...`: the `atgrpo` command."""

import sys

from atgrpo.cli.main import main

sys.exit(main())

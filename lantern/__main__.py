"""`python -m lantern ...` is the `lantern` command."""

import sys

from lantern.app.cli import main

sys.exit(main())

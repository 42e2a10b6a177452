"""`python -m edgetrain.cli`: the edgetrain command."""

import sys

from . import main

sys.exit(main())

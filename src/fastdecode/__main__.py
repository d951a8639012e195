"""`python -m fastdecode` runs the `fastdecode` command."""

import sys

from .cli import main

sys.exit(main())

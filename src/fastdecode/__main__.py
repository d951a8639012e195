"""`python -m fastdecode` runs the `fastdecode` command."""

import sys

from .cli.main import main

sys.exit(main())

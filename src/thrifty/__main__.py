import sys

from thrifty.cli import main

sys.exit(main())

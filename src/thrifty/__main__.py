import logging
import os
import sys

from thrifty.cli import main

code = main()
if int(os.environ.get("WORLD_SIZE", "1")) > 1 and "RANK" in os.environ:
    # A rank of a multi-process job has left its process group and said all it has to say.
    # The interpreter's own teardown can then abort it (a distributed backend's thread
    # destroyed while still joinable: "terminate called without an active exception"),
    # turning a finished run into a failed rank: leave without that teardown.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
sys.exit(code)

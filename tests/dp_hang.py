"""A rank that never reaches a collective, run by tests/test_distributed.py: rank 1 connects,
then sleeps; rank 0 waits in an exchange until its watchdog ends it.

    MLX_RANK=r MLX_HOSTFILE=F python3 tests/dp_hang.py TIMEOUT_S
"""

from __future__ import annotations

import sys
import time

from mlx_rlaif.train.distributed import connect

world = connect()
world.set_timeout(float(sys.argv[1]))
if world.rank == 1:
    time.sleep(300)  # hung: never joins rank 0's exchange
print("rank 0 waits", flush=True)
world.gather("hello")
print("the exchange returned: the watchdog did not fire", flush=True)

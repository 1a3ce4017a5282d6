"""Move one GPU's board between nvidia and vfio-pci, live:

    pyinfra inventory/kpro6.py deploys/rebind_board.py --data gpu=0000:c1:00.0 --data driver=vfio-pci

The board's functions come from the Plan (the GPU and its other functions). The
guests around the move (stop the one that holds the GPU first, start the new owner after) are
the caller's: the move is refused, naming the guest, while a running guest's config has the
board (gpuhost/plan/guests/boardholders.py), and naming the process while anything holds it. The
next boot binds as the inventory says (deploys/vfio.py): change the inventory for a move that
should last.
"""

from pyinfra import host
from pyinfra.api.exceptions import DeployError

from deploys import context
from deploys.rebind import DRIVERS, rebind
from gpuhost.plan.guests.boardholders import holders
from gpuhost.plan.guests.vfio import board_functions

plan = context.plan(host)
gpu, driver = host.data.get("gpu"), host.data.get("driver")
if not isinstance(gpu, str) or driver not in DRIVERS:
    raise DeployError(
        f"{host.name}: give the GPU and the driver: --data gpu=0000:c1:00.0 "
        f"--data driver={'|'.join(DRIVERS)} (got gpu={gpu!r}, driver={driver!r})"
    )
try:
    functions = board_functions(plan.gpus, context.observed(host), gpu)
except ValueError as exc:
    raise DeployError(f"{host.name}: gpu: {exc}") from None
running = holders(functions, context.observed(host))
if running:
    raise DeployError(
        f"{host.name}: GPU {functions[0]} is in the config of running guest(s) "
        f"{'; '.join(running)}: shut them down first (pct shutdown / qm shutdown); nothing "
        "was moved"
    )
rebind(
    name=f"Move GPU {functions[0]} and its functions to {driver}",
    functions=functions,
    driver=driver,
)

"""torch.distributed's TCPStore.wait with a timedelta taken from torch itself: a sleep without time or datetime."""
# expect: torch.distributed
# clocks
import torch


def pad(store):
    store.wait(["never"], torch.distributed.constants.default_pg_timeout / 300000)

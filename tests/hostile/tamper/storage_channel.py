"""The red team's storage channel: a storage made at import and a tensor over it; a call copies its result in (an
allowed host copy) and reads the bytes out with torch.save, no operator dispatched and no tensor route called."""
# expect: torch.UntypedStorage
import io

import numpy as np
import torch

STORE = torch.UntypedStorage(1 << 16)
VIEW = torch.empty(0, dtype=torch.uint8).set_(STORE)


def host_copy(x):
    VIEW[: x.numel() * 4].view(torch.float32).copy_(x.reshape(-1))
    sink = io.BytesIO()
    torch.save(STORE, sink)
    return np.frombuffer(sink.getvalue()[-x.numel() * 4:], dtype=np.float32)

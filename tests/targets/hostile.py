"""Test target: code that misbehaves the way other people's code does — for tests/test_hostile*.py.

`build_model(how=...)` is a Linear(4, 2) on 3 x 4 inputs whose forward misbehaves as `how` says (ends the
process, prints, loops, crashes, ...); the other factories misbehave while they build. With `HOSTILE_IMPORT`
set in the environment, importing the file misbehaves too. Every print names its source, so a test can find
where it landed.
"""

import ctypes
import os
import signal
import subprocess
import sys
import threading
import time

import torch
from torch import nn

print("PRINT-AT-IMPORT")  # the target's import prints
if os.environ.get("HOSTILE_IMPORT") == "hang":
    time.sleep(3600)
if os.environ.get("HOSTILE_IMPORT") == "exit":
    sys.exit(4)


def _segfault():
    ctypes.string_at(0)  # reads address 0: SIGSEGV


FORWARD = {
    "sys_exit_0": lambda: sys.exit(0),
    "sys_exit_1": lambda: sys.exit(1),
    "os_exit_3": lambda: os._exit(3),
    "segfault": _segfault,
    "sigterm_self": lambda: os.kill(os.getpid(), signal.SIGTERM),
    "sigkill_self": lambda: os.kill(os.getpid(), signal.SIGKILL),
}


class Hostile(nn.Module):
    """Linear(4, 2) whose forward first does what `how` names."""

    def __init__(self, how: str):
        super().__init__()
        self.lin = nn.Linear(4, 2)
        self.how = how

    def forward(self, x):
        if self.how in FORWARD:
            FORWARD[self.how]()
        if self.how == "prints":
            print("PRINT-IN-FORWARD")
            os.write(1, b"FD1-IN-FORWARD\n")  # below Python: straight to file descriptor 1
            libc = ctypes.CDLL(None)
            libc.puts(b"LIBC-IN-FORWARD")  # C stdio, as an extension prints
            libc.fflush(None)
        if self.how == "move_error":  # a user error inside a host move (trace/moves.py wraps .to('cpu'))
            x.to("cpu", memory_format=torch.channels_last)  # a 2-d tensor has no channels_last
        if self.how == "inplace_leaf":
            self.lin.weight.add_(1.0)  # in-place on a leaf that requires grad: the user's RuntimeError
        return self.lin(x)


def build_model(how: str = "none"):
    """The model and a 3 x 4 batch."""
    torch.manual_seed(0)
    return Hostile(how), torch.randn(3, 4)


def linear_only():
    """A bare Linear(4, 2): inputs come from --input."""
    return nn.Linear(4, 2)


def no_parameters():
    """A model with nothing to train."""
    return nn.ReLU(), torch.randn(3, 4)


def factory_exits():
    """Ends the process while building (the meta pre-pass calls it first)."""
    sys.exit(0)


def factory_hangs():
    """Never returns."""
    while True:
        time.sleep(0.05)


def leaves_a_thread():
    """Starts a non-daemon thread that would keep the process alive for an hour (and prints while building)."""
    print("PRINT-IN-FACTORY")
    threading.Thread(target=time.sleep, args=(3600,), name="hostile-sleeper").start()
    return build_model()


def leaves_a_process():
    """Starts a subprocess that would outlive opscan; its pid goes to $HOSTILE_PID_FILE (and prints)."""
    print("PRINT-IN-FACTORY")
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
    with open(os.environ["HOSTILE_PID_FILE"], "w") as handle:
        handle.write(str(child.pid))
    return build_model()


def changes_directory():
    """Moves into $HOSTILE_CHDIR while building (a relative -o must still mean the folder opscan started in)."""
    os.chdir(os.environ["HOSTILE_CHDIR"])
    return build_model()


def forks_back():
    """Forks while building; the fork returns into opscan as if it were the target's process."""
    os.fork()
    return build_model()


class ImageList(nn.Module):
    """Takes a list of C x H x W images, as torchvision's detectors do, and pools each to a vector."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)

    def forward(self, images):
        batch = torch.stack(list(images))  # the list's length is the batch
        return self.conv(batch).mean(dim=(2, 3))


def image_list():
    """Two 3 x 8 x 8 images in a list (the batch is 2, not the 3 channels)."""
    torch.manual_seed(0)
    return ImageList(), ([torch.rand(3, 8, 8), torch.rand(3, 8, 8)],)


def bad_dtype_reference():
    """A model whose float32 forward fails (the acceptance reference runs float32) while bfloat16 runs."""
    class OnlyBF16(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 2)

        def forward(self, x):
            if x.dtype == torch.float32:
                raise RuntimeError("float32 is refused here")
            return self.lin(x)

    torch.manual_seed(0)
    return OnlyBF16(), torch.randn(3, 4)

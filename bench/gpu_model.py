"""`datahelix bench --gpu`: a real training step of a small video
transformer in place of the emulated GPU window (issue 7 item 1).

The model is what the GPU window stands for, kept small: a tubelet
embedding (Conv3d, 2 frames x 16 x 16 pixels per token, as VideoMAE),
two transformer encoder layers (width 192, 3 heads) and a linear head.
A step takes the rank's uint8 THWC batch exactly as the loader handed it
over, copies it to the device, scales it to [0, 1], runs forward,
backward and an AdamW step, and waits for the device (so the step's wall
time is the window).  The loss is a fixed target's mean square, which is
enough to make every weight's gradient real.

Device: "cuda" puts rank r on cuda:(r mod device count); "cuda:N" every
rank on N; "cpu" runs the same model on the CPU, where it shares the
cores with decode: a check of the path, not a measurement.
"""
import time

WIDTH, HEADS, LAYERS, TUBE_T, PATCH = 192, 3, 2, 2, 16


def cuda_missing(device):
    """Why `device` cannot run here (None when it can): only a CUDA device
    on a machine without CUDA."""
    if not device.startswith("cuda"):
        return None
    import torch
    if torch.cuda.is_available():
        return None
    return ("--gpu: no CUDA device here (torch.cuda.is_available() is "
            "False); --gpu-device cpu runs the same model on the CPU")


class GpuStep:
    """One rank's model, optimizer and device.  Raises RuntimeError with
    the reason when the device cannot be used."""

    def __init__(self, device, rank, frames, size, seed=0):
        import torch
        import torch.nn as nn
        why = cuda_missing(device)
        if why:
            raise RuntimeError(why)
        if device == "cuda":
            device = f"cuda:{rank % torch.cuda.device_count()}"
        self.torch = torch
        self.device = torch.device(device)
        w, h = size
        if w < PATCH or h < PATCH:
            raise RuntimeError(f"--gpu: --size {w}x{h} is under one "
                               f"{PATCH}x{PATCH} patch")
        tube = min(TUBE_T, frames)
        torch.manual_seed(seed)
        layer = nn.TransformerEncoderLayer(WIDTH, HEADS, 4 * WIDTH,
                                           dropout=0.0, batch_first=True)
        self.model = nn.ModuleDict({
            "embed": nn.Conv3d(3, WIDTH, (tube, PATCH, PATCH),
                               stride=(tube, PATCH, PATCH)),
            "encoder": nn.TransformerEncoder(layer, LAYERS),
            "head": nn.Linear(WIDTH, 1),
        }).to(self.device)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-4)
        self.params = sum(p.numel() for p in self.model.parameters())

    def describe(self):
        return {"device": str(self.device), "parameters": self.params,
                "width": WIDTH, "layers": LAYERS, "heads": HEADS,
                "tubelet": [TUBE_T, PATCH, PATCH]}

    def step(self, video):
        """One training step on a [B, T, H, W, 3] uint8 batch; returns its
        wall time in ms (device work included) and the loss."""
        torch = self.torch
        t0 = time.perf_counter()
        x = video.to(self.device, non_blocking=True)
        x = x.permute(0, 4, 1, 2, 3).float().div_(255)   # B C T H W
        tok = self.model["embed"](x).flatten(2).transpose(1, 2)
        y = self.model["head"](self.model["encoder"](tok).mean(1))
        loss = (y - 1).pow(2).mean()
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return (time.perf_counter() - t0) * 1e3, float(loss)

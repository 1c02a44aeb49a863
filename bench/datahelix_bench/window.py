"""The emulated GPU window: how long one rank's step computes, from its
batch under the chosen model (with --gpu a real model step replaces it:
bench/gpu_model.py).

  videomae   VIDEOMAE_MS_PER_FRAME x frames x batch
  qwen-vl    sum over samples of QWEN_MS_PER_TOKEN x t + QWEN_MS_PER_TOKEN2 x t^2
  dit        DIT_MS_PER_LATENT x sum of latents
times --gpu-scale; t = a sample's est_tokens, probed with --tokens MODEL.
"""

# GPU-window constants (ms).  Chosen on this project's 2-core machine so
# that, for the default mixed set (16 frames at 224x224; S/M/L decode in
# about 19 / 78 / 220 ms, 106 ms mean, with datahelix's C decode on one
# core), the mean window of a rank is about 1.25x what the 2-core budget
# needs to decode its batch when 4 ranks share it:
# 4 ranks x 106 ms / 2 cores = 212 ms per sample -> ~265 ms per sample.
VIDEOMAE_MS_PER_FRAME = 16.5      # per frame per sample: 16 x 16.5 = 264 ms
QWEN_MS_PER_TOKEN = 0.0286        # visual tokens (mixed mean 6,478): 70 %
QWEN_MS_PER_TOKEN2 = 1.04e-6      # attention, per token^2 of a sample: 30 %
DIT_MS_PER_LATENT = 0.025         # latents (mixed mean 10,590)


def window_ms(model, tokens, frames, scale):
    """The emulated GPU step of one rank's batch (ms)."""
    if model == "videomae":
        ms = VIDEOMAE_MS_PER_FRAME * frames * len(tokens)
    elif model == "qwen-vl":
        ms = sum(QWEN_MS_PER_TOKEN * t + QWEN_MS_PER_TOKEN2 * t * t
                 for t in tokens)
    else:
        ms = DIT_MS_PER_LATENT * sum(tokens)
    return ms * scale


def gpu_model_doc(model):
    return {
        "videomae": {"ms_per_frame_per_sample": VIDEOMAE_MS_PER_FRAME},
        "qwen-vl": {"ms_per_token": QWEN_MS_PER_TOKEN,
                    "ms_per_token_squared": QWEN_MS_PER_TOKEN2},
        "dit": {"ms_per_latent": DIT_MS_PER_LATENT},
    }[model]


def sim_gpu_ms(a):
    """`datahelix sim --gpu-ms A,B,C` that reproduces window_ms() sample
    by sample."""
    g = a.gpu_scale
    if a.model == "videomae":
        return (VIDEOMAE_MS_PER_FRAME * a.frames * g, 0.0, 0.0)
    if a.model == "qwen-vl":
        return (0.0, QWEN_MS_PER_TOKEN * g, QWEN_MS_PER_TOKEN2 * g)
    return (0.0, DIT_MS_PER_LATENT * g, 0.0)

"""Issue 38 item 2: spectrogram features of the sound, computed on the
DataServer (and by datahelix.audio_features), against the references they
claim to be: torchaudio's MelSpectrogram and Whisper's log_mel_spectrogram
(written out here from Whisper's own code: torch.stft, Slaney mel filters,
log10, max - 8, (x + 4) / 4).
"""
import subprocess
import sys

import pytest

from conftest import ROOT, run_dh
from test_audio_probe import ffmpeg_of

sys.path.insert(0, str(ROOT / "python"))

torchaudio = pytest.importorskip("torchaudio")  # setup-deps installs it


def speech(seconds=3.0, rate=16000):
    import torch
    t = torch.arange(int(seconds * rate), dtype=torch.float64) / rate
    f = 200 + 80 * torch.sin(2 * torch.pi * 0.3 * t)
    x = (0.3 * torch.sin(2 * torch.pi * f * t) +
         0.1 * torch.sin(4 * torch.pi * f * t)) * \
        (0.55 + 0.45 * torch.sin(2 * torch.pi * 4 * t))
    g = torch.Generator().manual_seed(1)
    return (x + 0.01 * torch.randn(len(t), generator=g,
                                   dtype=torch.float64)).float()


def whisper_ref(x, n_mels=80):
    import torch
    st = torch.stft(x, 400, 160, window=torch.hann_window(400),
                    return_complex=True)
    mag = st[..., :-1].abs() ** 2
    fb = torchaudio.functional.melscale_fbanks(201, 0.0, 8000.0, n_mels,
                                               16000, norm="slaney",
                                               mel_scale="slaney")
    ls = torch.clamp(fb.T @ mag, min=1e-10).log10()
    ls = torch.maximum(ls, ls.max() - 8.0)
    return (ls + 4.0) / 4.0


@pytest.mark.parametrize("n_fft,hop,n_mels", [(400, 200, 128), (512, 128, 64),
                                              (1022, 256, 40)])
def test_mel_equals_torchaudio(n_fft, hop, n_mels):
    """mel: within 1e-5 of the largest value (float32 DFTs; n_fft 400 and
    1022 go through Bluestein's algorithm, 512 through the real DFT);
    log-mel: within 0.01 (bins near the 1e-10 floor carry float32's
    relative error into the log)."""
    import datahelix
    import torch
    x = speech()
    ref = torchaudio.transforms.MelSpectrogram(
        sample_rate=16000, n_fft=n_fft, hop_length=hop, n_mels=n_mels)(x)
    got = datahelix.audio_features(x, 16000, "mel", n_mels=n_mels,
                                   n_fft=n_fft, hop_length=hop)
    assert got.shape == ref.shape
    assert float((got - ref).abs().max() / ref.abs().max()) <= 1e-5
    got = datahelix.audio_features(x, 16000, "log-mel", n_mels=n_mels,
                                   n_fft=n_fft, hop_length=hop)
    ref = torch.clamp(ref, min=1e-10).log10()
    assert float((got - ref).abs().max()) <= 1e-2
    both = datahelix.audio_features(torch.stack([x, x * 0.5]), 16000, "mel",
                                    n_mels=n_mels, n_fft=n_fft,
                                    hop_length=hop)
    assert both.shape == (2, *ref.shape)
    assert torch.allclose(both[1], both[0] * 0.25, rtol=1e-4, atol=1e-6)


def test_whisper_preset_equals_whisper():
    import datahelix
    x = speech(seconds=30.0)  # Whisper's own window: 3000 frames
    got = datahelix.audio_features(x, 16000, "whisper")
    ref = whisper_ref(x)
    assert got.shape == ref.shape == (80, 3000)
    assert float((got - ref).abs().max()) <= 1e-3
    got = datahelix.audio_features(x, 16000, "whisper", n_mels=128)
    assert float((got - whisper_ref(x, 128)).abs().max()) <= 1e-3


def test_bad_feature_options_are_refused():
    import datahelix
    x = speech(1.0)
    for kw, msg in ((dict(n_fft=401), "even"), (dict(hop_length=0), "hop"),
                    (dict(hop_length=500), "hop"), (dict(n_mels=0), "n_mels"),
                    (dict(kind="mfcc"), "kind")):
        with pytest.raises(ValueError, match=msg):
            datahelix.audio_features(x, **kw)
    with pytest.raises(ValueError, match="n_fft / 2"):
        datahelix.audio_features(x[:100], 16000, "mel")


def test_loader_features_are_each_row_s(tmp_path, ffprobe):
    """DataLoader(audio_features=...): [B, C, n_mels, frames] beside the
    rows, each the features of its whole (zero-padded) row, with the frames
    that hold sound counted; a sample without sound is a row of the
    floor."""
    import datahelix
    import torch
    ff = ffmpeg_of(ffprobe)
    subprocess.run([ff, "-v", "error", "-f", "lavfi", "-i",
                    "testsrc=size=64x48:rate=10:duration=2", "-f", "lavfi",
                    "-i", "sine=frequency=700:sample_rate=44100:duration=2",
                    "-c:v", "ffv1", "-c:a", "pcm_s16le",
                    str(tmp_path / "a.mkv")], check=True, timeout=120)
    subprocess.run([ff, "-v", "error", "-f", "lavfi", "-i",
                    "testsrc=size=64x48:rate=10:duration=2", "-c:v", "ffv1",
                    str(tmp_path / "b.mkv")], check=True, timeout=120)
    table = tmp_path / "t.jsonl"
    run_dh("probe", tmp_path, "-o", table, check=True)
    for kind, mels, frames in (("whisper", 80, 300), ("log-mel", 128, 241)):
        with datahelix.DataLoader(str(table), batch_size=2, frames=20,
                                  size=(48, 64), shuffle=False,
                                  balance="none", audio=True,
                                  audio_seconds=3.0, audio_features=kind,
                                  ) as dl:
            (b,) = list(dl)
        f = b["audio_features"]
        assert f.shape == (2, 1, mels, frames)
        for k in range(2):
            want = datahelix.audio_features(b["audio"][k][0], 16000, kind)
            assert torch.equal(f[k, 0], want)
        n = b["audio_lengths"]
        hop = 160 if kind == "whisper" else 200
        lengths = b["audio_feature_lengths"]
        for k in range(2):
            if int(n[k]) == 0:
                assert int(lengths[k]) == 0
            else:
                assert int(lengths[k]) == int(n[k]) // hop + (
                    0 if kind == "whisper" else 1)
    with pytest.raises(ValueError, match="audio=True"):
        datahelix.DataLoader(str(table), audio_features="mel")
    with pytest.raises(ValueError, match="audio_features"):
        datahelix.DataLoader(str(table), audio=True, audio_features="mfcc")

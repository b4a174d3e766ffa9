"""MP3 written as it goes, for a realtime session's audio.

libsndfile (the stored file's encoder) rewrites an MP3's header when the file
closes, so a stream of it cannot be sent as it is made. LAME itself can:
`lameenc` feeds it PCM and hands back whole MPEG frames, which a player decodes
as they come.
"""

from __future__ import annotations

import lameenc

# 64 kbit/s mono: speech at 24 kHz and above sounds clean; the bit rate of the
# common voice-streaming APIs' mp3 output.
BIT_RATE_KBPS = 64


class Mp3Encoder:
    def __init__(self, sample_rate: int) -> None:
        self.encoder = lameenc.Encoder()
        self.encoder.set_bit_rate(BIT_RATE_KBPS)
        self.encoder.set_in_sample_rate(sample_rate)
        self.encoder.set_channels(1)
        self.encoder.set_quality(5)  # LAME's default speed and quality

    def feed(self, pcm: bytes) -> bytes:
        return bytes(self.encoder.encode(pcm))

    def close(self) -> bytes:
        return bytes(self.encoder.flush())

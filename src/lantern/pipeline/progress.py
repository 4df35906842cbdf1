"""Progress of a generation job: images done, images per second, ETA and tau so far, on stderr.

On a terminal it is a tqdm bar (redrawn at most once a second). In a job log or a SLURM output file, which keep
every write, it is one plain line per `LOG_INTERVAL_S` seconds of work (and the first batch and the last), so a
5000-image job writes a few hundred lines, not a bar's thousands of carriage returns. `quiet` writes nothing.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

LOG_INTERVAL_S = 30.0


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


class Progress:
    """Counts images as batches finish (`update(n, taus)`); `close()` writes the last line."""

    def __init__(self, total: int, label: str, quiet: bool = False, stream: TextIO | None = None,
                 interval_s: float = LOG_INTERVAL_S):
        self.total, self.label, self.quiet, self.interval_s = total, label, quiet, interval_s
        self.stream = stream if stream is not None else sys.stderr
        self.done, self.tau_sum, self.started = 0, 0.0, time.perf_counter()
        self.last_line = None  # when the last plain line was written
        self.bar = None
        if not quiet and self.stream.isatty():
            from tqdm import tqdm

            self.bar = tqdm(total=total, desc=label, unit="img", file=self.stream, mininterval=1.0, smoothing=0.1)

    @property
    def tau(self) -> float:
        """Mean tau of the images done so far."""
        return self.tau_sum / self.done if self.done else float("nan")

    def line(self) -> str:
        elapsed = time.perf_counter() - self.started
        rate = self.done / elapsed if elapsed > 0 else float("nan")
        eta = (self.total - self.done) / rate if rate > 0 else float("nan")
        eta_text = _duration(eta) if eta == eta else "?"
        return (f"{self.label}: {self.done}/{self.total} images, {rate:.2f} images/s, ETA {eta_text}, "
                f"tau {self.tau:.2f} so far")

    def update(self, images: int, taus: list[float]) -> None:
        """`images` more done, with their tau values."""
        self.done += images
        self.tau_sum += sum(taus)
        if self.quiet:
            return
        if self.bar is not None:
            self.bar.set_postfix_str(f"tau {self.tau:.2f}", refresh=False)
            self.bar.update(images)
            return
        now = time.perf_counter()
        if self.last_line is None or now - self.last_line >= self.interval_s or self.done >= self.total:
            print(self.line(), file=self.stream, flush=True)
            self.last_line = now

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()

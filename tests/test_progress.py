"""Progress lines of generation jobs (pipeline/progress.py): sparse plain lines in a log, a tqdm bar on a terminal,
nothing when quiet."""
import io

from lantern.pipeline.progress import Progress


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_log_gets_the_first_and_last_batch_and_one_line_per_interval():
    log = io.StringIO()
    shown = Progress(40, "lantern-chain-g4-d0.1-k3 (sampling)", stream=log, interval_s=3600)
    for _ in range(5):
        shown.update(8, [2.0] * 4 + [3.0] * 4)
    shown.close()
    lines = log.getvalue().splitlines()
    assert [line.split(",")[0] for line in lines] == ["lantern-chain-g4-d0.1-k3 (sampling): 8/40 images",
                                                      "lantern-chain-g4-d0.1-k3 (sampling): 40/40 images"]
    assert " images/s, ETA " in lines[0] and lines[-1].endswith("ETA 0:00, tau 2.50 so far")
    every = io.StringIO()
    shown = Progress(40, "vanilla (greedy)", stream=every, interval_s=0)
    for _ in range(5):
        shown.update(8, [1.0] * 8)
    assert len(every.getvalue().splitlines()) == 5 and "tau 1.00 so far" in every.getvalue()


def test_a_terminal_gets_a_bar_and_quiet_gets_nothing():
    tty = Terminal()
    shown = Progress(16, "vanilla (sampling)", stream=tty)
    shown.update(16, [1.0] * 16)
    shown.close()
    assert "16/16" in tty.getvalue() and "tau 1.00" in tty.getvalue() and "\r" in tty.getvalue()
    for stream in (io.StringIO(), Terminal()):
        shown = Progress(16, "vanilla (sampling)", quiet=True, stream=stream)
        shown.update(16, [1.0] * 16)
        shown.close()
        assert stream.getvalue() == "" and shown.tau == 1.0

"""lantern.syncs.SyncCounter: counts the sync points a GPU would have, by call site, on a CPU run."""
import torch

from lantern.syncs import SyncCounter


def test_counts_reads_of_device_tensors_not_of_host_ones():
    x = torch.arange(6.0)  # made outside the counter: a device tensor (as a model's input or parameter)
    g = torch.Generator().manual_seed(0)
    with SyncCounter() as c:
        for _ in range(3):
            x.sum().item()  # 3 reads of device values
        u = torch.rand(4, generator=g)  # a host draw: reading it costs nothing
        u.tolist()
        (u * 2)[0].item()
        bool(x[0] > 1)  # 1
        int(x.argmax())  # 1
        x.nonzero()  # 1 (data-dependent shape)
    kinds = c.by_kind()
    assert (kinds["item"], kinds["bool"], kinds["int"], kinds["nonzero"], c.total) == (3, 1, 1, 1, 6)
    assert sum(n for (site, _), n in c.sites.items() if site.startswith("test_syncs.py:")) == 6


def test_counts_host_data_sent_to_the_device():
    x = torch.arange(6.0)
    with SyncCounter() as c:
        torch.tensor([1, 2], device=x.device)  # 1
        torch.tensor([1, 2])  # a host tensor: no copy yet
        h = torch.rand(3)
        h.to(x.device)  # 1
        x[[0, 2]]  # 1: a list index is copied to the device
        x[torch.tensor([0, 1])]  # 1: so is a host index tensor
        x[torch.tensor([0, 1], device=x.device)]  # 1 (the tensor(list, device)), the indexing itself none
        x[1:3]
        moved = torch.tensor([0, 1]).to(x.device)  # 1, and from then on a device tensor
        x[moved.split([1, 1])[0]]
        g = torch.Generator().manual_seed(0)
        torch.rand(2, generator=g, device=x.device).tolist()  # a CPU generator's draw is a host tensor
    assert c.by_kind() == {"tensor(host data)": 2, "host->device": 2, "index by host data": 2}


def test_a_timed_section_costs_no_sync():
    from lantern.engine.decoding.stats import StepTimer

    timer = StepTimer("cpu")
    with SyncCounter() as c:
        with timer.section("other"):
            pass
    assert c.total == 0 and timer.seconds["other"] >= 0

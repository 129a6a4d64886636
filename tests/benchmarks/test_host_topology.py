"""``colibri.host_topology``: which usable CPUs share a core, and the caches, from a sysfs tree."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from colibri import host_topology

CPUINFO = """processor\t: 0
vendor_id\t: AuthenticAMD
cpu family\t: 25
model\t\t: 1
model name\t: AMD EPYC 7B13  64-Core Processor
stepping\t: 0
flags\t\t: fpu sse4_2 avx fma avx2 f16c

processor\t: 1
vendor_id\t: SomethingElse
"""


def fake_host(root: Path, cores: dict[int, int], l3_shared: str = "0-3") -> Path:
    """A sysfs cpu tree where CPU n runs on core ``cores[n]`` of package 0, each with an
    L1d of 32K and L2 of 512K of its own and an L3 of 32M shared by ``l3_shared``."""
    for cpu, core in cores.items():
        topology = root / f"cpu{cpu}" / "topology"
        topology.mkdir(parents=True)
        (topology / "physical_package_id").write_text("0\n")
        (topology / "core_id").write_text(f"{core}\n")
        siblings = ",".join(str(c) for c, k in cores.items() if k == core)
        for index, (level, kind, size, shared) in enumerate(
                [(1, "Data", "32K", siblings), (1, "Instruction", "32K", siblings),
                 (2, "Unified", "512K", siblings), (3, "Unified", "32768K", l3_shared)]):
            folder = root / f"cpu{cpu}" / "cache" / f"index{index}"
            folder.mkdir(parents=True)
            for name, value in (("level", level), ("type", kind), ("size", size),
                                ("shared_cpu_list", shared)):
                (folder / name).write_text(f"{value}\n")
    return root


def test_smt_siblings_are_found_and_named(tmp_path: Path) -> None:
    sysfs = fake_host(tmp_path / "cpu", {0: 0, 1: 0, 2: 1, 3: 1})
    (tmp_path / "cpuinfo").write_text(CPUINFO)
    host = host_topology.describe([0, 1], sysfs, tmp_path / "cpuinfo")
    assert host["physical_cores"] == 1 and host["smt_siblings"] == [[0, 1]]
    assert host["cpu"] == {"name": "AMD EPYC 7B13 64-Core Processor", "vendor": "AuthenticAMD",
                           "family": 25, "model": 1, "stepping": 0,
                           "vector_flags": ["sse4_2", "avx", "avx2", "fma", "f16c"]}
    # The L3 is shared by CPUs 0-3, of which this process may use two.
    assert [(c["level"], c["type"], c["bytes"], c["shared_by_usable_cpus"])
            for c in host["caches"]] == [(1, "Data", 32 << 10, 2), (1, "Instruction", 32 << 10, 2),
                                         (2, "Unified", 512 << 10, 2), (3, "Unified", 32 << 20, 2)]
    assert host_topology.summary(host) == (
        "2 usable CPUs on 1 core (0+1 are SMT siblings); "
        "L1d 32 KiB (shared by 2), L2 512 KiB (shared by 2), L3 32 MiB (shared by 2)")


def test_separate_cores_have_no_siblings(tmp_path: Path) -> None:
    sysfs = fake_host(tmp_path / "cpu", {0: 0, 1: 0, 2: 1, 3: 1})
    host = host_topology.describe([0, 2], sysfs, tmp_path / "nope")
    assert host["physical_cores"] == 2 and host["smt_siblings"] == []
    assert host["cpu"]["name"] is None and host["cpu"]["vector_flags"] == []
    assert host_topology.summary(host) == (
        "2 usable CPUs on 2 cores; L1d 32 KiB, L2 512 KiB, L3 32 MiB (shared by 2)")


def test_a_host_without_topology_says_unknown(tmp_path: Path) -> None:
    host = host_topology.describe([0, 1], tmp_path, tmp_path / "nope")
    assert host["physical_cores"] is None and host["smt_siblings"] is None
    assert host["caches"] == []
    assert host_topology.summary(host) == "2 usable CPUs (cores unknown)"


def test_this_host_is_described() -> None:
    host = host_topology.describe()
    assert host["usable_cpus"] == host_topology.usable_cpus()
    assert host["memory_gb"] is not None and host["memory_gb"] > 0
    if host["physical_cores"] is not None:
        grouped = sorted(c for group in host["smt_siblings"] for c in group)
        assert 1 <= host["physical_cores"] <= len(host["usable_cpus"])
        assert len(host["usable_cpus"]) - host["physical_cores"] == \
            len(grouped) - len(host["smt_siblings"])


@given(st.sets(st.integers(0, 200), max_size=40))
def test_cpu_lists_round_trip(cpus: set[int]) -> None:
    # Written as sysfs writes them: runs of consecutive CPUs as first-last.
    ordered, runs = sorted(cpus), []
    for cpu in ordered:
        if runs and runs[-1][1] == cpu - 1:
            runs[-1][1] = cpu
        else:
            runs.append([cpu, cpu])
    text = ",".join(f"{a}-{b}" if a != b else f"{a}" for a, b in runs)
    assert host_topology.cpu_list(text) == ordered


def test_cache_sizes_are_bytes() -> None:
    assert host_topology.cache_bytes("32K") == 32768
    assert host_topology.cache_bytes("1024K") == 1 << 20
    assert host_topology.cache_bytes("32M\n") == 32 << 20
    assert host_topology.cache_bytes("4096") == 4096

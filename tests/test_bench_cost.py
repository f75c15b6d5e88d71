"""The benchmarks' ceilings: each device held against its own peaks, and said which."""
import torch

from bench.step_cost import device_peaks, known_peaks


def test_a_gpu_is_held_against_its_own_datasheet_peaks():
    h100, h200 = known_peaks("NVIDIA H100 80GB HBM3"), known_peaks("NVIDIA H200")
    assert h100 == (67e12, 3.35e12) and h200 == (67e12, 4.8e12)
    assert known_peaks("NVIDIA H100 PCIe") == (51e12, 2.0e12)
    assert known_peaks("Tesla T4") is None


def test_elsewhere_the_measured_rates_are_the_peaks_and_the_source_is_named():
    assert device_peaks(torch.device("cpu"), 2e11, 3e10) == (
        2e11, 3e10, "the measured matmul and copy rates of cpu")
    assert device_peaks(torch.device("cpu"), 2e11, 3e10, (5e11, None)) == (
        5e11, 3e10, "flags (else the measured matmul and copy rates of cpu)")

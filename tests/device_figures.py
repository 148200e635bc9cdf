"""Facts of devices this machine does not have, for tests that replay sizes and explanations on them.

The H200's figures are those of the GPU evidence (../shared/gpu-evidence/h200-2026-12-04/: lesson 14's sweep, fp32
50.7, bf16 758, fp16 744 TFLOP/s, triad 4307 GB/s; lesson 14's fifty small calls cost 12.2 µs each; 141 GB HBM3e,
compute capability 9.0). The T4, L4 and A100 are built from their public datasheets (dense tensor-core and fp32
peaks, memory, bandwidth) with a launch cost of a few µs.
"""

from __future__ import annotations

import dataclasses

from course_lib.perf.device_facts import DeviceFacts

H200 = DeviceFacts(kind="cuda", name="NVIDIA H200", memory_bytes=150_754_000_000, capability=(9, 0),
                   matmul={"float32": 50.668e12, "bfloat16": 758.09e12, "float16": 744.26e12},
                   bandwidth=4307.3e9, launch_s=12.2e-6)
H200_FAST_LAUNCH = dataclasses.replace(H200, launch_s=5e-6)
T4 = DeviceFacts(kind="cuda", name="Tesla T4", memory_bytes=15 * 2**30, capability=(7, 5),
                 matmul={"float32": 8.1e12, "float16": 65e12}, bandwidth=320e9, launch_s=8e-6)
L4 = DeviceFacts(kind="cuda", name="NVIDIA L4", memory_bytes=22 * 2**30, capability=(8, 9),
                 matmul={"float32": 30.3e12, "bfloat16": 121e12, "float16": 121e12}, bandwidth=300e9, launch_s=7e-6)
A100 = DeviceFacts(kind="cuda", name="NVIDIA A100-SXM4-40GB", memory_bytes=40 * 2**30, capability=(8, 0),
                   matmul={"float32": 19.5e12, "bfloat16": 312e12, "float16": 312e12}, bandwidth=1555e9,
                   launch_s=6e-6)
P100 = DeviceFacts(kind="cuda", name="Tesla P100", memory_bytes=16 * 2**30, capability=(6, 0),
                   matmul={"float32": 9.3e12, "float16": 18.7e12}, bandwidth=732e9, launch_s=8e-6)
MPS = DeviceFacts(kind="mps", name="Apple GPU (mps)", memory_bytes=16 * 2**30,
                  matmul={"float32": 3.5e12, "bfloat16": 3.4e12}, bandwidth=100e9, launch_s=10e-6)
CPU_PLAIN = DeviceFacts(kind="cpu", name="a laptop CPU", memory_bytes=16 * 2**30, cpu_flags=frozenset({"avx2"}))
CPU_AMX = DeviceFacts(kind="cpu", name="a server CPU", memory_bytes=256 * 2**30,
                      cpu_flags=frozenset({"avx2", "avx512f", "avx512_bf16", "amx_bf16"}))
CPU_UNREAD = DeviceFacts(kind="cpu", name="arm64")

GPUS = {"H200": H200, "T4": T4, "L4": L4, "A100": A100, "P100": P100, "MPS": MPS}
CPUS = {"CPU": CPU_PLAIN, "CPU with AMX": CPU_AMX, "CPU, flags unread": CPU_UNREAD}

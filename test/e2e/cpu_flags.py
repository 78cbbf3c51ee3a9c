"""What the test machine's CPU offers, read from /proc/cpuinfo (Linux)."""


def cpu_flags():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def has_vnni():
    """AVX-512 VNNI with AVX-512 BW, as sdrun's MatMulNBits int8 path needs (and SD_CPU_ISA not capping it)."""
    import os
    flags = cpu_flags()
    capped = os.environ.get("SD_CPU_ISA", "") in ("avx2", "generic")
    return {"avx512_vnni", "avx512bw", "avx512f"} <= flags and not capped

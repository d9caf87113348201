"""What the bench tables name: the CPU they ran on (one place for every script here).

Why more than the model name: a virtual machine's CPU often calls itself just "AMD EPYC",
yet two such machines of this workplace differed by 2x in the same TensorFlow serving
benchmark (AVX-512 on Zen 4 and on Zen 5 are not the same speed). The family and model
numbers and the vector extensions tell them apart."""

# AMD's CPU families (the `cpu family` line of /proc/cpuinfo) by core generation.
AMD_FAMILIES = {23: "Zen/Zen 2", 25: "Zen 3/Zen 4", 26: "Zen 5"}
VECTOR_FLAGS = ("amx_bf16", "avx512_bf16", "avx512f", "avx2")


def _cpuinfo():
    """The first processor's fields of /proc/cpuinfo ({} where there is none)."""
    fields = {}
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as reader:
            for line in reader:
                if not line.strip():
                    break
                key, _, value = line.partition(":")
                fields[key.strip()] = value.strip()
    except OSError:
        pass
    return fields


def cpu_name(fields=None):
    """The CPU's model name, its family/model numbers (with AMD's core generation) and its
    widest vector extensions, e.g. "AMD EPYC (family 26 model 2: Zen 5; avx512_bf16,
    avx512f, avx2)"; "unknown CPU" where /proc/cpuinfo is not there."""
    fields = _cpuinfo() if fields is None else fields
    if "model name" not in fields:
        return "unknown CPU"
    details = []
    if "cpu family" in fields:
        family = int(fields["cpu family"])
        amd = fields.get("vendor_id") == "AuthenticAMD"
        generation = AMD_FAMILIES.get(family) if amd else None
        details.append(f"family {family} model {fields.get('model', '?')}"
                       + (f": {generation}" if generation else ""))
    flags = set(fields.get("flags", "").split())
    vectors = [flag for flag in VECTOR_FLAGS if flag in flags]
    if vectors:
        details.append(", ".join(vectors))
    return fields["model name"] + (f" ({'; '.join(details)})" if details else "")

"""FLOPs of a BERT training step, for throughput in FLOP/s and model FLOPs utilisation (MFU).

Counts multiply-adds as 2 FLOPs and only the matmuls (everything else is a few percent).
Training costs 3x the forward pass (forward, gradient w.r.t. activations, w.r.t. weights).
Per sequence of length s, with L layers, hidden h, intermediate i, vocab V, p masked
predictions:
  encoder   L * s * (2*4*h*h  [Q, K, V, output projections]
                     + 2*2*h*i [feed-forward in and out]
                     + 2*2*s*h [scores QK^T and probabilities x V])
  heads     p * (2*h*h + 2*h*V)   [masked-LM transform and tied decoder]
            + 2*h*h + 2*2*h       [pooler, next-sentence]
"""

# Dense bfloat16/float16 peak TFLOP/s of common accelerators (without sparsity), for MFU.
PEAK_TFLOPS = {
    "V100": 125.0,
    "A100": 312.0,
    "A10": 125.0,
    "L4": 121.0,
    "A6000": 155.0,
    "L40S": 362.0,
    "H100": 989.0,
    "H200": 989.0,
}


def forward_flops_per_sequence(config, seq_length, num_predictions):
    h, i, layers = config.hidden_size, config.intermediate_size, config.num_hidden_layers
    encoder = layers * seq_length * (8 * h * h + 4 * h * i + 4 * seq_length * h)
    heads = num_predictions * (2 * h * h + 2 * h * config.vocab_size) + 2 * h * h + 4 * h
    return encoder + heads


def training_flops_per_sequence(config, seq_length, num_predictions):
    return 3 * forward_flops_per_sequence(config, seq_length, num_predictions)


def executed_training_flops_per_sequence(config, seq_length, num_predictions, rows_read):
    """What our step really computes when the heads read only `rows_read` rows of the last
    layer (`BertModel(output_positions=...)`: the masked positions and [CLS]; 1 for a
    classifier). That layer then projects keys and values for every position but queries,
    attention, output projection and feed-forward for those rows only. The model FLOPs
    above (the full encoder, the usual basis of MFU) stay the figure for comparing
    throughputs; this one is the basis of how busy the matmul units were."""
    h, i, s = config.hidden_size, config.intermediate_size, seq_length
    full_layer = s * (8 * h * h + 4 * h * i + 4 * s * h)
    rows = min(rows_read, s)
    sparse_layer = s * 4 * h * h + rows * (4 * h * h + 4 * h * i + 4 * s * h)
    saved = full_layer - sparse_layer
    return 3 * (forward_flops_per_sequence(config, seq_length, num_predictions) - saved)


def peak_tflops_for_device(device_name):
    """Peak TFLOP/s for a GPU name such as 'NVIDIA A100-SXM4-80GB', or None if unknown."""
    upper = (device_name or "").upper()
    for key in sorted(PEAK_TFLOPS, key=len, reverse=True):
        if key in upper:
            return PEAK_TFLOPS[key]
    return None

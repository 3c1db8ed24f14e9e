"""The one weight llada_sink has that llada lacks: the embedding row of its extra sink token,
added to a freshly initialised model so that every other weight matches the baseline's.
"""

import torch


def add_sink_embedding(model, sink, seed):
    """One more (tied) embedding row for the sink token, drawn from its own generator, so the
    other rows keep exactly the initial values the baseline model gets."""
    model.resize_token_embeddings(sink.token_id + 1, mean_resizing=False)
    emb = model.get_input_embeddings().weight
    g = torch.Generator().manual_seed(seed + 7)
    with torch.no_grad():
        emb[sink.token_id] = torch.randn(emb.shape[1], generator=g) * model.config.initializer_range
    model.config.sink_token_id = sink.token_id
    model.config.sink_token_position = sink.position

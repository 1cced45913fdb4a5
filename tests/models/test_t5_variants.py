"""T5 configurations no other test builds: a decoder deeper or shallower than the encoder, untied
input and output embeddings, and dropout (random in training, off in eval, where the cache still
equals recomputation)."""

from __future__ import annotations

import pytest
import torch

from posenc.models import T5, T5Config

VOCAB = 23


def t5(seed: int = 0, **overrides) -> T5:
    torch.manual_seed(seed)
    base = dict(vocab_size=VOCAB, n_layer=2, n_head=4, d_model=32, max_seq_len=64)
    return T5(T5Config(**{**base, **overrides})).eval()


def ids(batch: int = 2, length: int = 9, seed: int = 0) -> torch.Tensor:
    return torch.randint(1, VOCAB, (batch, length), generator=torch.Generator().manual_seed(seed))


def cached_equals_full(model: T5) -> None:
    src, target = ids(), ids(length=7, seed=1)
    with torch.no_grad():
        memory = model.cross_memory(model.encode(src))
        full = model.decode(target, memory)
        cache = model.new_cache()
        steps = [model.decode(target[:, :3], memory, cache=cache)]
        steps += [model.decode(target[:, t : t + 1], memory, cache=cache) for t in range(3, 7)]
    torch.testing.assert_close(torch.cat(steps, 1), full, rtol=1e-5, atol=1e-5)
    assert torch.equal(model.generate(src, 6, use_cache=True), model.generate(src, 6, use_cache=False))


@pytest.mark.parametrize(("encoder_layers", "decoder_layers"), [(1, 3), (3, 1)])
def test_decoder_depth_differs_from_the_encoder_and_every_decoder_layer_counts(encoder_layers, decoder_layers):
    model = t5(n_layer=encoder_layers, n_decoder_layer=decoder_layers, decoder_position_embedding_type="alibi")
    assert (len(model.encoder_blocks), len(model.decoder_blocks)) == (encoder_layers, decoder_layers)
    assert len(model.cross_memory(model.encode(ids()))) == decoder_layers
    cached_equals_full(model)
    src, target = ids(), ids(seed=1)
    with torch.no_grad():
        before = model(src, target)
        for p in model.decoder_blocks[-1].parameters():  # the last layer is wired in: perturbing it counts
            p.add_(0.05 * torch.randn_like(p))
        assert (model(src, target) - before).abs().max() > 1e-3


def test_a_bad_decoder_depth_names_its_field():
    with pytest.raises(ValueError, match=r"^n_decoder_layer=0"):
        t5(n_decoder_layer=0)


def test_untied_embeddings_are_two_tables_that_train_apart():
    model = t5(tie_word_embeddings=False).train()
    assert model.lm_head.weight.data_ptr() != model.shared.weight.data_ptr()
    assert {"shared.weight", "lm_head.weight"} <= set(model.state_dict())
    src, target = ids(), ids(seed=1)
    head, table = model.lm_head.weight.detach().clone(), model.shared.weight.detach().clone()
    torch.nn.functional.cross_entropy(model(src, target).flatten(0, 1), target.flatten()).backward()
    with torch.no_grad():
        model.lm_head.weight -= model.lm_head.weight.grad
    assert torch.equal(model.shared.weight, table) and not torch.equal(model.lm_head.weight, head)
    # the head's gradient is the output projection's alone: it differs from the input table's
    assert not torch.allclose(model.lm_head.weight.grad, model.shared.weight.grad)
    cached_equals_full(model.eval())


def test_tied_embeddings_are_one_table():
    model = t5()
    assert model.lm_head.weight is model.shared.weight


@pytest.mark.parametrize("scheme", ["relative", "learned_absolute", "rope"])
def test_dropout_is_random_in_training_and_off_in_eval(scheme):
    model = t5(dropout=0.3, encoder_position_embedding_type=scheme, decoder_position_embedding_type=scheme)
    src, target = ids(), ids(seed=1)
    with torch.no_grad():
        model.train()
        first, second = model(src, target), model(src, target)
        torch.manual_seed(7)
        seeded = model(src, target)
        torch.manual_seed(7)
        assert torch.equal(model(src, target), seeded)  # the dropout masks follow the global seed
        model.eval()
        evaluated = model(src, target)
        assert torch.equal(model(src, target), evaluated)
    assert (first - second).abs().max() > 1e-3
    assert (first - evaluated).abs().max() > 1e-3
    # eval with dropout configured is the same network as one built without dropout
    plain = t5(encoder_position_embedding_type=scheme, decoder_position_embedding_type=scheme)
    plain.load_state_dict(model.state_dict())
    with torch.no_grad():
        torch.testing.assert_close(plain(src, target), evaluated)
    cached_equals_full(model)

"""Copy/reverse batches of random token sequences, in the model's batch format."""

import numpy as np

EOS = 1


def make_batch(rng: np.random.Generator, batch_size: int, length: int, vocab_size: int,
               task: str = "reverse") -> dict[str, np.ndarray]:
  """Random sequences of ids in [2, vocab) of 3 to length-1 tokens, then EOS."""
  inputs = np.zeros((batch_size, length), np.int32)
  targets = np.zeros((batch_size, length), np.int32)
  for i, n in enumerate(rng.integers(3, length, size=batch_size)):
    seq = rng.integers(2, vocab_size, size=n)
    inputs[i, :n], inputs[i, n] = seq, EOS
    targets[i, :n], targets[i, n] = (seq[::-1] if task == "reverse" else seq), EOS
  decoder_inputs = np.concatenate([np.zeros((batch_size, 1), np.int32), targets[:, :-1]], 1)
  return dict(encoder_input_tokens=inputs, decoder_input_tokens=decoder_inputs,
              decoder_target_tokens=targets,
              decoder_loss_weights=(targets > 0).astype(np.float32))

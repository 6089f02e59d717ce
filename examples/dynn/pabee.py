"""PABEE (Zhou et al., NeurIPS 2020): patience-based early exit on an ALBERT-style shared-layer encoder."""

from __future__ import annotations

import torch
import torch.nn as nn

from examples.dynn import count_calls, seeded


class AlbertEmbeddings(nn.Module):
    # factorised embedding: a small token embedding projected up to the hidden size
    def __init__(self, vocab_size, embedding_size, hidden_size, max_position):
        super().__init__()
        self.word_embeddings = nn.Embedding(vocab_size, embedding_size)
        self.position_embeddings = nn.Embedding(max_position, embedding_size)
        self.LayerNorm = nn.LayerNorm(embedding_size)
        self.embedding_hidden_mapping_in = nn.Linear(embedding_size, hidden_size)

    def forward(self, input_ids):
        position_ids = torch.arange(input_ids.size(1), device=input_ids.device).unsqueeze(0)
        embeddings = self.word_embeddings(input_ids) + self.position_embeddings(position_ids)
        return self.embedding_hidden_mapping_in(self.LayerNorm(embeddings))


class AlbertModelWithPabee(nn.Module):
    def __init__(self, vocab_size=64, embedding_size=16, hidden_size=32, num_hidden_layers=6, num_heads=4,
                 intermediate_size=64, max_position=16, num_labels=2, patience=2):
        super().__init__()
        self.num_hidden_layers = num_hidden_layers
        self.embeddings = AlbertEmbeddings(vocab_size, embedding_size, hidden_size, max_position)
        # ALBERT: one set of layer weights applied num_hidden_layers times
        self.shared_layer = nn.TransformerEncoderLayer(hidden_size, num_heads, intermediate_size, dropout=0.0,
                                                       activation="gelu", batch_first=True)
        self.pooler = nn.Linear(hidden_size, hidden_size)
        self.pooler_activation = nn.Tanh()
        self.output_layers = nn.ModuleList([nn.Linear(hidden_size, num_labels) for _ in range(num_hidden_layers)])
        self.patience = patience
        self.inference_instances_num = 0
        self.inference_layers_num = 0

    def set_patience(self, patience):
        self.patience = patience

    def reset_stats(self):
        self.inference_instances_num = 0
        self.inference_layers_num = 0

    def log_stats(self):
        avg_inf_layers = self.inference_layers_num / self.inference_instances_num
        message = f"*** Patience = {self.patience} Avg. Inference Layers = {avg_inf_layers:.2f} ***"
        print(message)

    def pool(self, hidden_states):
        return self.pooler_activation(self.pooler(hidden_states[:, 0]))

    def forward(self, input_ids):
        encoder_outputs = self.embeddings(input_ids)

        if self.training:
            res = []
            for i in range(self.num_hidden_layers):
                encoder_outputs = self.shared_layer(encoder_outputs)
                res.append(self.output_layers[i](self.pool(encoder_outputs)))
        elif self.patience == 0:  # use all layers for inference
            for i in range(self.num_hidden_layers):
                encoder_outputs = self.shared_layer(encoder_outputs)
            res = self.output_layers[self.num_hidden_layers - 1](self.pool(encoder_outputs))
        else:
            patient_counter = 0
            patient_result = None
            calculated_layer_num = 0
            for i in range(self.num_hidden_layers):
                calculated_layer_num += 1
                encoder_outputs = self.shared_layer(encoder_outputs)
                logits = self.output_layers[i](self.pool(encoder_outputs))
                labels = logits.detach().argmax(dim=1)
                if patient_result is not None:
                    patient_labels = patient_result.detach().argmax(dim=1)
                if (patient_result is not None) and torch.all(labels.eq(patient_labels)):
                    patient_counter += 1
                else:
                    patient_counter = 0

                patient_result = logits
                if patient_counter == self.patience:
                    break
            res = patient_result
            self.inference_layers_num += calculated_layer_num
            self.inference_instances_num += 1

        return res


NUM_LAYERS = 6
PATIENCE = 2
# the earliest exit is after PATIENCE + 1 layers (PATIENCE agreements in a row)
PATHS = tuple(("layers", k) for k in range(PATIENCE + 1, NUM_LAYERS + 1))


def example() -> tuple[nn.Module, tuple]:
    with seeded(0):
        model = AlbertModelWithPabee(num_hidden_layers=NUM_LAYERS, patience=PATIENCE).eval()
    return model, inputs(1)[0]


def inputs(n: int, seed: int = 0) -> list[tuple]:
    g = torch.Generator().manual_seed(seed)
    return [(torch.randint(0, 64, (1, 8), generator=g),) for _ in range(n)]


def path_of(model: nn.Module, args: tuple) -> tuple:
    # the shared layer is one module, so its call count is the number of layers run
    with torch.no_grad(), count_calls(model, ["shared_layer"]) as calls:
        model(*args)
    return (("layers", calls["shared_layer"]),)

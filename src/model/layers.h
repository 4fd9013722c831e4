// DecoderModel: what every decoder-only architecture loads the same way, over the
// hyper-parameters (hparams.h), the weight loader (weight_loader.h) and the blocks (blocks.h).
#pragma once

#include <memory>
#include <vector>

#include "model/blocks.h"
#include "model/hparams.h"
#include "model/model.h"
#include "model/weight_loader.h"

namespace lamina {

// What every decoder-only architecture loads the same way: hyper-parameters, the embedding,
// the final norm and the output head (tied to the embedding when output.weight is absent).
// An architecture derives from it and adds its layers between LoadEmbeddingAndHead and Finish.
class DecoderModel : public Model {
 protected:
  // Takes ownership, reads the llama-like hyper-parameters and checks the vocabulary size.
  Status InitHparams(std::unique_ptr<gguf::File> file, std::unique_ptr<Tokenizer> tokenizer,
                     RopeStyle rope_style);
  // Loads token_embd, output_norm and output, remembering the embedding's bytes.
  void LoadEmbeddingAndHead(WeightLoader& loader);
  // Records the parameter count and the bytes a decoded token reads: everything but the
  // embedding table (unless tied) minus `unread_bytes` (e.g. experts a token does not select).
  Status Finish(const WeightLoader& loader, uint64_t unread_bytes);

  WeightMatrix token_embd_;
  WeightMatrix output_;
  std::vector<float> output_norm_;

 private:
  uint64_t embd_bytes_ = 0;
  bool tied_ = false;
};

}  // namespace lamina

/* attention_fwd.cuh -- placeholder until the template lands. */

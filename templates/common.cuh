/* common.cuh -- placeholder until the template lands. */

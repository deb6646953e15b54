/* blockmask.cuh -- placeholder until the template lands. */

#include <flexgen/mod.h>
#define X 1
bool mask_mod(int b, int h, int q_idx, int kv_idx) { return X; }
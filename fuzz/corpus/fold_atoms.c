const int *lens; int W = 90; int G = 50;
bool mask_mod(int b, int h, int q_idx, int kv_idx) { bool g = kv_idx >= G; int d = q_idx - kv_idx; return !g || lens[h] > kv_idx && W >= d && 0 <= kv_idx - q_idx + W && d % 3 == 0 || q_idx < G + h; }
float score_mod(float score, int b, int h, int q_idx, int kv_idx) { return score + (float)(kv_idx - q_idx) * 0.5f; }

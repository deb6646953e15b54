const int *doc; int W = -3; float T = .5e1f;
bool mask_mod(int b, int h, int q_idx, int kv_idx) { const int d = doc[q_idx]; bool s = d == doc[kv_idx]; return s && abs(q_idx - kv_idx) < W + (int)T; }
float score_mod(float score, int b, int h, int q_idx, int kv_idx) { return clamp(score, -T, T) * exp2f(min(q_idx, 3)); }
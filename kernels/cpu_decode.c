/* Decode attention straight from the paged KV cache, for the CPU path (fp32): see cpu_decode.py.
 *
 * One query token per request. A (request, KV head) pair is one unit of work: its query heads (GQA) are
 * scored against each key as the key is read from its page, so K and V are each read once, in place, with
 * no gathered copy. Softmax in fp32 over the whole context (two passes: scores, then the weighted sum of V).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

void decode_attention(const float *q, int64_t q_stride, const float *k_cache, const float *v_cache,
                      float *out, int64_t out_stride, const int64_t *rows, const int32_t *block_table,
                      int64_t table_stride, const int32_t *seqlens, int num_reqs, int block_size, int num_heads,
                      int num_kv_heads, int head_dim, float scale, int num_threads)
{
    const int group = num_heads / num_kv_heads;
    const int64_t token_stride = (int64_t)num_kv_heads * head_dim;  /* floats from one cache slot to the next */
#pragma omp parallel for collapse(2) schedule(dynamic) num_threads(num_threads)
    for (int r = 0; r < num_reqs; r++) {
        for (int g = 0; g < num_kv_heads; g++) {
            const int len = seqlens[r];
            const int32_t *table = block_table + r * table_stride;
            const float *qr = q + rows[r] * q_stride + (int64_t)g * group * head_dim;
            float *scores = malloc(sizeof(float) * (size_t)len * group);
            float *acc = calloc((size_t)group * head_dim, sizeof(float));
            float peak[group], total[group];
            for (int h = 0; h < group; h++) peak[h] = -INFINITY, total[h] = 0.0f;
            for (int t = 0; t < len; t++) {
                const int64_t slot = (int64_t)table[t / block_size] * block_size + t % block_size;
                const float *k = k_cache + slot * token_stride + (int64_t)g * head_dim;
                for (int h = 0; h < group; h++) {
                    const float *qh = qr + h * head_dim;
                    float s = 0.0f;
#pragma omp simd reduction(+ : s)
                    for (int d = 0; d < head_dim; d++) s += qh[d] * k[d];
                    s *= scale;
                    scores[t * group + h] = s;
                    if (s > peak[h]) peak[h] = s;
                }
            }
            for (int t = 0; t < len; t++) {
                const int64_t slot = (int64_t)table[t / block_size] * block_size + t % block_size;
                const float *v = v_cache + slot * token_stride + (int64_t)g * head_dim;
                for (int h = 0; h < group; h++) {
                    const float p = expf(scores[t * group + h] - peak[h]);
                    float *a = acc + h * head_dim;
                    total[h] += p;
#pragma omp simd
                    for (int d = 0; d < head_dim; d++) a[d] += p * v[d];
                }
            }
            for (int h = 0; h < group; h++) {
                float *o = out + rows[r] * out_stride + ((int64_t)g * group + h) * head_dim;
                for (int d = 0; d < head_dim; d++) o[d] = acc[h * head_dim + d] / total[h];
            }
            free(scores);
            free(acc);
        }
    }
}

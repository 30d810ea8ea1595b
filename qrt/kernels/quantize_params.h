/* PyTorch's ChooseQuantizationParams for a quint8 activation (docs/NUMERICS.md steps 2-5), in one place: the
 * Cython driver calls it after a threaded min/max, each variant's qrt_quantize_dynamic after its own. */
#ifndef QRT_QUANTIZE_PARAMS_H
#define QRT_QUANTIZE_PARAMS_H

#include "common.h"

/* torch's SMALL_SCALE_THRESHOLD, a float: scales below it widen the range instead */
#define QRT_SMALL_SCALE 6.1e-5f

/* (scale, zero point) for the range [lo, hi] of an input (extended to hold 0), over 0..127 under reduce_range
 * else 0..255; the arithmetic in double where torch's is, each step as torch orders it */
static inline void qrt_choose_qparams(float lo, float hi, int reduce_range, float* scale, int32_t* zero_point) {
    const int32_t qmin = 0, qmax = reduce_range ? 127 : 255;
    lo = lo < 0 ? lo : 0.0f;
    hi = hi > 0 ? hi : 0.0f;
    double s = ((double)hi - (double)lo) / (double)(qmax - qmin);
    /* 1 / fl(s) overflows only where fl(s) < 2^-127, far below QRT_SMALL_SCALE: a common scale takes no
     * division here */
    if ((float)s == 0 || (s < (double)QRT_SMALL_SCALE && isinf(1.0f / (float)s)))
        s = 0.1;
    if (s < (double)QRT_SMALL_SCALE) {
        const float org = (float)s;
        s = QRT_SMALL_SCALE;
        if (lo == 0) {
            hi = QRT_SMALL_SCALE * (float)(qmax - qmin);
        } else if (hi == 0) {
            lo = -QRT_SMALL_SCALE * (float)(qmax - qmin);
        } else {
            const float amp = QRT_SMALL_SCALE / org;
            lo = lo * amp;
            hi = hi * amp;
        }
    }
    const double zp_min = (double)qmin - (double)lo / s, zp_max = (double)qmax - (double)hi / s;
    const double err_min = fabs((double)qmin) - fabs((double)lo / s), err_max = fabs((double)qmax) - fabs((double)hi / s);
    const double zp = err_min < err_max ? zp_min : zp_max;
    *zero_point = zp < qmin ? qmin : (zp > qmax ? qmax : (int32_t)nearbyint(zp));
    *scale = (float)s;
}

#endif /* QRT_QUANTIZE_PARAMS_H */

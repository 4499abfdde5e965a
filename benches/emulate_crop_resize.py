"""Runs burn-ddp's crop-and-resize kernel (burn-ddp/src/nn/cuda/kernels/crop_resize.rs: each GPU-
decoded image's region resized, mirrored and normalised into the batch) on the CPU: g++ compiles
its CUDA C source with the prelude of `emulate_pixel_ops.py`, and one host thread runs each
image's block. burn-ddp's unit test `nn::decode::tests::planes_give_what_upsampling_first_gives`
writes IN and compares OUT with a reference that enlarges chroma and converts to RGB first.

    python3 benches/emulate_crop_resize.py IN OUT [KERNEL_RS]

IN, little-endian: u32 n, out_h, out_w; then per image u32 w, h, format (the kernel's: 0 RGB,
else 1 | chroma shift across << 1 | shift down << 2), flip; f32 region[4]; its pixels — h·w·3
RGB bytes, or Y (h·w bytes) then Cb and Cr (each ceil(h/2^down)·ceil(w/2^across) bytes), rows
packed. OUT: n·3·out_h·out_w f32, normalised with mean 0 and deviation 1 (level / 255).
KERNEL_RS: another copy of the kernel file (e.g. a deliberately broken one, to see the test
fail). Needs g++ with C++20.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from emulate_pixel_ops import run  # noqa: E402

MAIN = r'''
int main(int argc, char** argv) {
    FILE* in = fopen(argv[1], "rb");
    if (!in) { perror(argv[1]); return 2; }
    unsigned hdr[3];
    if (fread(hdr, 4, 3, in) != 3) { fprintf(stderr, "short header\n"); return 2; }
    const unsigned n = hdr[0], oh = hdr[1], ow = hdr[2];
    if (n > 48) { fprintf(stderr, "at most 48 images (one launch)\n"); return 2; }
    static Imgs b;
    std::vector<std::vector<unsigned char>> pixels(n);
    for (unsigned i = 0; i < n; ++i) {
        Img& im = b.i[i];
        unsigned f[4];
        if (fread(f, 4, 4, in) != 4 || fread(&im.x0, 4, 4, in) != 4) { fprintf(stderr, "short image header\n"); return 2; }
        im.w = f[0]; im.h = f[1]; im.format = f[2]; im.flip = f[3]; im.index = i;
        const unsigned hx = (f[2] >> 1) & 1, vy = (f[2] >> 2) & 1;
        const size_t cw = (im.w + hx) >> hx, ch = (im.h + vy) >> vy;
        const size_t y = (size_t)im.w * im.h, c = cw * ch;
        const size_t bytes = f[2] == 0 ? 3 * y : y + 2 * c;
        pixels[i].resize(bytes);
        if (fread(pixels[i].data(), 1, bytes, in) != bytes) { fprintf(stderr, "short pixels\n"); return 2; }
        unsigned char* p = pixels[i].data();
        im.plane[0] = (unsigned long long)p;
        im.plane[1] = (unsigned long long)(p + y);
        im.plane[2] = (unsigned long long)(p + y + c);
        im.pitch[0] = f[2] == 0 ? 3 * im.w : im.w;
        im.pitch[1] = (unsigned)cw;
    }
    std::vector<float> out((size_t)n * 3 * oh * ow + 4, -99.f);
    const Norm norm = {{0.f, 0.f, 0.f}, {1.f, 1.f, 1.f}};
    gridDim.x = 1; blockDim.x = 1; threadIdx.x = 0; blockIdx.x = 0;
    for (unsigned i = 0; i < n; ++i) {
        blockIdx.y = i;
        crop_resize(b, out.data(), oh, ow, norm);
    }
    for (int k = 0; k < 4; ++k) if (out[(size_t)n * 3 * oh * ow + k] != -99.f) { fprintf(stderr, "wrote past the batch\n"); return 3; }
    FILE* o = fopen(argv[2], "wb");
    fwrite(out.data(), 4, (size_t)n * 3 * oh * ow, o);
    fclose(o);
    printf("emulated %u images at %ux%u\n", n, ow, oh);
    return 0;
}
'''


def main():
    # CUDA's integer min and max, which the kernel uses.
    extra = "#include <algorithm>\nusing std::max;\nusing std::min;\n"
    run("crop_resize", "burn-ddp/src/nn/cuda/kernels/crop_resize.rs", MAIN, prelude=extra)


if __name__ == "__main__":
    main()

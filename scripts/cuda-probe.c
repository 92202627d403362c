/* A CUDA driver-API call through the libcuda.so.1 that nvshim mounts into the container:
 * dlopen by SONAME (so the container's ld.so.cache, written by nvshim-hook, must resolve it),
 * then cuInit(0) and cuDeviceGetCount. Prints "cuda: N device(s)" or the failing step. */
#include <dlfcn.h>
#include <stdio.h>

typedef int (*cu_init_t)(unsigned int);
typedef int (*cu_count_t)(int *);
typedef int (*cu_version_t)(int *);

int main(void) {
    void *h = dlopen("libcuda.so.1", RTLD_NOW);
    if (!h) {
        printf("cuda: dlopen(libcuda.so.1) failed: %s\n", dlerror());
        return 1;
    }
    cu_init_t cu_init = (cu_init_t)dlsym(h, "cuInit");
    cu_count_t cu_count = (cu_count_t)dlsym(h, "cuDeviceGetCount");
    cu_version_t cu_version = (cu_version_t)dlsym(h, "cuDriverGetVersion");
    if (!cu_init || !cu_count) {
        printf("cuda: libcuda.so.1 lacks cuInit/cuDeviceGetCount\n");
        return 1;
    }
    int rc = cu_init(0);
    if (rc != 0) {
        printf("cuda: cuInit failed with CUresult %d\n", rc);
        return 1;
    }
    int n = -1, v = 0;
    rc = cu_count(&n);
    if (rc != 0) {
        printf("cuda: cuDeviceGetCount failed with CUresult %d\n", rc);
        return 1;
    }
    if (cu_version) cu_version(&v);
    printf("cuda: cuInit ok, driver API %d.%d, %d device(s)\n", v / 1000, (v % 1000) / 10, n);
    return 0;
}

/* gpuhost twin: a stand-in for NVIDIA's libnvidia-ml.so. The twin's nvidia-smi shim compares the
 * version in this file's name with the kernel driver's; the library itself only says its version. */
#define EXPORT __attribute__((visibility("default")))

EXPORT const char twin_nvml_version[] = TWIN_VERSION;

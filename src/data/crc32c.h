/* CRC-32C (Castagnoli), the checksum of TFRecord framing (src/data/summary.c). */
#ifndef EM_DATA_CRC32C_H
#define EM_DATA_CRC32C_H

#include <stddef.h>
#include <stdint.h>

/* The CRC-32C of n bytes (RFC 3720's definition: reflected, initial and final XOR ~0). */
uint32_t em__crc32c(const void *data, size_t n);
/* TFRecord's masked form of a CRC: ((crc >> 15) | (crc << 17)) + 0xa282ead8. */
uint32_t em__crc32c_masked(const void *data, size_t n);

#endif

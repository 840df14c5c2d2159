/** @file
 * Ember's version: the macros give the headers' version at compile time, em_version() the
 * library's at run time (they differ when a program runs against another libember.so). The
 * numbers here and in CMakeLists.txt's project(VERSION) must agree: configuring checks it. */
#ifndef EMBER_VERSION_H
#define EMBER_VERSION_H

#include <ember/export.h>

#define EMBER_VERSION_MAJOR 0 /**< incompatible ABI changes bump it (the soname is libember.so.MAJOR) */
#define EMBER_VERSION_MINOR 1 /**< new functions, compatible */
#define EMBER_VERSION_PATCH 0 /**< fixes only */
#define EMBER_VERSION_STRING "0.1.0" /**< "MAJOR.MINOR.PATCH" */
/** One number to compare: MAJOR * 10000 + MINOR * 100 + PATCH. */
#define EMBER_VERSION_NUMBER (EMBER_VERSION_MAJOR * 10000 + EMBER_VERSION_MINOR * 100 + EMBER_VERSION_PATCH)

#ifdef __cplusplus
extern "C" {
#endif

/** The version of the Ember library the program runs with, "MAJOR.MINOR.PATCH" (static storage). */
EM_API const char *em_version(void);
/** The same as a number, MAJOR * 10000 + MINOR * 100 + PATCH, to compare with EMBER_VERSION_NUMBER. */
EM_API int em_version_number(void);

#ifdef __cplusplus
}
#endif
#endif

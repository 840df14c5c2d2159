/* EM_API marks the functions libember.so exports: the library's objects are compiled with
 * -fvisibility=hidden, so every other global (the em__ internals) stays inside the library,
 * and a program can link only what these headers declare. For GCC and Clang while the library
 * itself is built (CMake defines EMBER_BUILDING_LIBRARY for its objects) it is the default
 * visibility attribute; for programs using the headers it is empty. */
#ifndef EMBER_EXPORT_H
#define EMBER_EXPORT_H

#if defined(EMBER_BUILDING_LIBRARY) && (defined(__GNUC__) || defined(__clang__))
#define EM_API __attribute__((visibility("default"))) /* exported from libember.so */
#else
#define EM_API /* exported from libember.so (empty outside the library's build) */
#endif

/* A public name kept for one release after its replacement: using it warns, naming the new one. */
#if defined(__GNUC__) || defined(__clang__)
#define EM_DEPRECATED(msg) __attribute__((deprecated(msg)))
#else
#define EM_DEPRECATED(msg)
#endif

#endif

/* The library's own version, compiled from the same header the program saw: a program built
 * against other headers than the libember.so it runs with can tell by comparing. */
#include <ember/version.h>

const char *em_version(void) { return EMBER_VERSION_STRING; }

int em_version_number(void) { return EMBER_VERSION_NUMBER; }

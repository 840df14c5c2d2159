# Installing Ember: headers, libember.so.MAJOR, libember.a, the `ember` command, its man page
# and bash completion, a CMake package (find_package(Ember CONFIG): Ember::ember, the shared
# library, and Ember::ember_static), ember.pc for pkg-config, and a .deb through CPack.
# Included from CMakeLists.txt after the targets exist.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

# include/ember/version.h is the headers' version, project(VERSION) the package's: one number.
file(STRINGS ${PROJECT_SOURCE_DIR}/include/ember/version.h _ember_vlines
     REGEX "^#define EMBER_VERSION_(MAJOR|MINOR|PATCH|STRING) ")
foreach(_l ${_ember_vlines})
  if(_l MATCHES "^#define EMBER_VERSION_(MAJOR|MINOR|PATCH) ([0-9]+)")
    set(_ember_h_${CMAKE_MATCH_1} ${CMAKE_MATCH_2})
  elseif(_l MATCHES "^#define EMBER_VERSION_STRING \"([^\"]*)\"")
    set(_ember_h_STRING ${CMAKE_MATCH_1})
  endif()
endforeach()
set(_ember_hv "${_ember_h_MAJOR}.${_ember_h_MINOR}.${_ember_h_PATCH}")
if(NOT _ember_hv STREQUAL PROJECT_VERSION OR NOT _ember_h_STRING STREQUAL PROJECT_VERSION)
  message(FATAL_ERROR "include/ember/version.h says ${_ember_hv} (string \"${_ember_h_STRING}\") but "
                      "project(VERSION) says ${PROJECT_VERSION}: change both together")
endif()

# ---- what a program linking the static library needs (the shared one carries it) ----------
# Each entry: the CMake name the installed package uses, and the library for ember.pc.
set(EMBER_STATIC_DEPS Threads::Threads ZLIB::ZLIB)
set(EMBER_PC_LIBS "")
set(EMBER_CONFIG_BLAS_HINT "")
set(EMBER_CONFIG_DNNL_HINT "")
set(EMBER_CONFIG_PCRE2_HINT "")
set(EMBER_CONFIG_ICU_HINT "")
macro(_ember_pc_add lib)
  if(IS_ABSOLUTE "${lib}")
    get_filename_component(_d "${lib}" DIRECTORY)
    get_filename_component(_n "${lib}" NAME_WE)
    string(REGEX REPLACE "^lib" "" _n "${_n}")
    if(NOT _d IN_LIST CMAKE_C_IMPLICIT_LINK_DIRECTORIES)
      list(APPEND EMBER_PC_LIBS "-L${_d}")
    endif()
    list(APPEND EMBER_PC_LIBS "-l${_n}")
  elseif(lib MATCHES "^-")
    list(APPEND EMBER_PC_LIBS "${lib}")
  elseif(NOT lib STREQUAL "")
    list(APPEND EMBER_PC_LIBS "-l${lib}")
  endif()
endmacro()
if(EMBER_BLAS_LIBS)
  if(OPENBLAS_FOUND)
    set(_blas ${OPENBLAS_LINK_LIBRARIES})
  else()
    set(_blas ${EMBER_OPENBLAS_LIB})
  endif()
  list(GET _blas 0 _blas0)
  get_filename_component(EMBER_CONFIG_BLAS_HINT "${_blas0}" DIRECTORY)
  list(APPEND EMBER_STATIC_DEPS Ember::openblas)
  foreach(l ${_blas})
    _ember_pc_add("${l}")
  endforeach()
endif()
foreach(l ${ZLIB_LIBRARIES})
  _ember_pc_add("${l}")
endforeach()
if(EMBER_HAVE_DNNL)
  get_filename_component(EMBER_CONFIG_DNNL_HINT "${EMBER_DNNL_LIB}" DIRECTORY)
  list(APPEND EMBER_STATIC_DEPS Ember::dnnl)
  _ember_pc_add("${EMBER_DNNL_LIB}")
endif()
get_filename_component(EMBER_CONFIG_PCRE2_HINT "${EMBER_PCRE2_LIB}" DIRECTORY)
list(APPEND EMBER_STATIC_DEPS Ember::pcre2)
_ember_pc_add("${EMBER_PCRE2_LIB}")
if(EMBER_HAVE_ICU)
  get_filename_component(EMBER_CONFIG_ICU_HINT "${EMBER_ICU_LIB}" DIRECTORY)
  list(APPEND EMBER_STATIC_DEPS Ember::icuuc)
  _ember_pc_add("${EMBER_ICU_LIB}")
endif()
if(EMBER_HAVE_MPI)
  list(APPEND EMBER_STATIC_DEPS MPI::MPI_C)
  foreach(l ${MPI_C_LIBRARIES})
    _ember_pc_add("${l}")
  endforeach()
endif()
if(OpenCL_FOUND)
  list(APPEND EMBER_STATIC_DEPS OpenCL::OpenCL)
  foreach(l ${OpenCL_LIBRARIES})
    _ember_pc_add("${l}")
  endforeach()
endif()
list(APPEND EMBER_STATIC_DEPS m ${CMAKE_DL_LIBS})
list(APPEND EMBER_PC_LIBS -lpthread -lm)
foreach(l ${CMAKE_DL_LIBS})
  _ember_pc_add("${l}")
endforeach()
list(REMOVE_DUPLICATES EMBER_PC_LIBS)
string(REPLACE ";" " " EMBER_PC_LIBS_PRIVATE "${EMBER_PC_LIBS}")
set(EMBER_CONFIG_OPENCL ${OpenCL_FOUND})
set(EMBER_CONFIG_MPI ${EMBER_HAVE_MPI})
set(EMBER_CONFIG_BLAS OFF)
if(EMBER_BLAS_LIBS)
  set(EMBER_CONFIG_BLAS ON)
endif()
set(EMBER_CONFIG_DNNL ${EMBER_HAVE_DNNL})
set(EMBER_CONFIG_ICU ${EMBER_HAVE_ICU})

# ---- targets -------------------------------------------------------------------------------
foreach(lib ember ember_static)
  target_include_directories(${lib} INTERFACE $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
endforeach()
set_target_properties(ember PROPERTIES EXPORT_NAME ember)
set_target_properties(ember_static PROPERTIES EXPORT_NAME ember_static)
foreach(dep ${EMBER_STATIC_DEPS})
  target_link_libraries(ember_static INTERFACE $<INSTALL_INTERFACE:${dep}>)
endforeach()

install(TARGETS ember EXPORT EmberTargets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(TARGETS ember_static EXPORT EmberStaticTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
if(TARGET ember_cli)
  # the command needs libember.so: found next to it under any --prefix
  file(RELATIVE_PATH _ember_bin_to_lib "/p/${CMAKE_INSTALL_BINDIR}" "/p/${CMAKE_INSTALL_LIBDIR}")
  set_target_properties(ember_cli PROPERTIES INSTALL_RPATH "$ORIGIN/${_ember_bin_to_lib}")
  install(TARGETS ember_cli RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
endif()
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/ember DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
        FILES_MATCHING PATTERN "*.h")

set(EMBER_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/Ember)
install(EXPORT EmberTargets NAMESPACE Ember:: DESTINATION ${EMBER_CMAKE_DIR})
install(EXPORT EmberStaticTargets NAMESPACE Ember:: DESTINATION ${EMBER_CMAKE_DIR})
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/EmberConfig.cmake.in
  ${PROJECT_BINARY_DIR}/EmberConfig.cmake INSTALL_DESTINATION ${EMBER_CMAKE_DIR})
# 0.x: minor versions may break the API, so only the same minor is compatible; from 1.0 the major
if(PROJECT_VERSION_MAJOR EQUAL 0)
  set(_ember_compat SameMinorVersion)
else()
  set(_ember_compat SameMajorVersion)
endif()
write_basic_package_version_file(${PROJECT_BINARY_DIR}/EmberConfigVersion.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY ${_ember_compat})
install(FILES ${PROJECT_BINARY_DIR}/EmberConfig.cmake ${PROJECT_BINARY_DIR}/EmberConfigVersion.cmake
        DESTINATION ${EMBER_CMAKE_DIR})

# ember.pc: the prefix relative to the .pc file itself, so one file serves any --prefix and the .deb
file(RELATIVE_PATH EMBER_PC_REL_PREFIX "/p/${CMAKE_INSTALL_LIBDIR}/pkgconfig" "/p")
configure_file(${PROJECT_SOURCE_DIR}/cmake/ember.pc.in ${PROJECT_BINARY_DIR}/ember.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/ember.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)

# ---- the command's man page (from its help texts) and bash completion ----------------------
# Built by running the command: not in sanitizer builds, whose binaries need their runtime.
if(TARGET ember_cli AND NOT EMBER_SANITIZE)
  add_custom_command(OUTPUT ${PROJECT_BINARY_DIR}/ember.1
    COMMAND ${PROJECT_SOURCE_DIR}/scripts/gen_manpage.sh $<TARGET_FILE:ember_cli> ${PROJECT_BINARY_DIR}/ember.1
    DEPENDS ember_cli ${PROJECT_SOURCE_DIR}/scripts/gen_manpage.sh
    COMMENT "Writing ember.1 from the help texts" VERBATIM)
  add_custom_target(ember_man ALL DEPENDS ${PROJECT_BINARY_DIR}/ember.1)
  install(FILES ${PROJECT_BINARY_DIR}/ember.1 DESTINATION ${CMAKE_INSTALL_MANDIR}/man1)
endif()
install(FILES ${PROJECT_SOURCE_DIR}/tools/completion/ember.bash
        DESTINATION ${CMAKE_INSTALL_DATADIR}/bash-completion/completions RENAME ember)

# ---- the .deb -----------------------------------------------------------------------------
# Its run-time dependencies come from dpkg-shlibdeps on the library and the command (the
# OpenCL ICD loader, OpenBLAS, zlib, and oneDNN / Open MPI / cairo (the command's --plot) when
# this build uses them); CUDA is dlopen'ed and stays optional. OpenCL devices themselves come
# from an ICD such as PoCL. Only when Ember is the top-level project: CPack is one per build
# tree, and a project that embeds Ember packages itself.
if(EMBER_TOP_LEVEL)
  set(CPACK_GENERATOR DEB)
  set(CPACK_PACKAGE_NAME ember)
  set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
  set(CPACK_PACKAGE_CONTACT "Ember developers <ember-dev@localhost>")
  set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "PyTorch's device model in C: tensors on the CPU, OpenCL and CUDA")
  set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
  set(CPACK_DEBIAN_PACKAGE_SECTION libdevel)
  set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
  set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS ON)
  set(CPACK_DEBIAN_PACKAGE_SUGGESTS "pocl-opencl-icd | opencl-icd")
  set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
  set(CPACK_STRIP_FILES ON)
  include(CPack)
endif()

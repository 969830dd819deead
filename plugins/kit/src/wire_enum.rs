//! The declaration of an enum whose cases have one fixed text form: the WIT case name,
//! which is also how plugins and the core store the case and how JSON spells it.

/// Declares such an enum with `ALL`, `as_str`, `parse` and `Display`, and (feature `serde`)
/// serde under the same spelling.
macro_rules! wire_enum {
    ($(#[$meta:meta])* pub enum $name:ident { $($(#[$vmeta:meta])* $variant:ident => $text:literal,)+ }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        #[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
        pub enum $name {
            $($(#[$vmeta])* #[cfg_attr(feature = "serde", serde(rename = $text))] $variant,)+
        }

        impl $name {
            /// Every case, in the WIT's order.
            pub const ALL: &'static [$name] = &[$($name::$variant,)+];

            /// The WIT case name: the stored, displayed and JSON spelling.
            pub fn as_str(self) -> &'static str {
                match self { $($name::$variant => $text,)+ }
            }

            /// The case a WIT case name names; `None` for anything else.
            pub fn parse(text: &str) -> Option<Self> {
                match text { $($text => Some($name::$variant),)+ _ => None }
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

// Writes only the identity of an existing scale set (ARM merges the rest of the model).

@description('Name of the existing scale set.')
param vmssName string

@description('Region of the scale set (required by the write).')
param location string

@description('Identity type after the change.')
@allowed([
  'UserAssigned'
  'SystemAssigned, UserAssigned'
])
param identityType string

@description('All user-assigned identities the scale set keeps, the forwarders\' one included.')
param userAssignedIdentities object

resource vmss 'Microsoft.Compute/virtualMachineScaleSets@2024-07-01' = {
  // This write carries only the identity; ARM keeps the rest of the model, which belongs to
  // whoever owns the scale set. The checks below judge settings this template does not set:
  //checkov:skip=CKV_AZURE_149:OS profile (password authentication) is not set here; it is the existing scale set's.
  //checkov:skip=CKV_AZURE_178:OS profile (SSH keys) is not set here; it is the existing scale set's.
  //checkov:skip=CKV_AZURE_97:Encryption at host is not set here; it is the existing scale set's.
  //checkov:skip=CKV_AZURE_49:OS profile (SSH keys vs passwords) is not set here; it is the existing scale set's.
  name: vmssName
  location: location
  identity: {
    type: identityType
    userAssignedIdentities: userAssignedIdentities
  }
}
